#!/usr/bin/env bash
# Spark GPU discovery script for tests: reports two GPUs that do not exist.
echo '{"name": "gpu", "addresses": ["0", "1"]}'
