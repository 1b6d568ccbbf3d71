#!/bin/bash
sort /app/fruits.txt > /tmp/fruits.sorted
cat /tmp/fruits.sorted > /app/fruits.txt
