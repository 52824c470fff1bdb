#!/bin/sh
# Runs in the job's workdir on whichever cluster takes it: these files travelled with the job.
echo "training with $(cat config/params.txt)"
