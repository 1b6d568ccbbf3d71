#!/bin/bash
echo finished >> /app/log.txt
