#!/bin/sh
# An isolated primary over verbs: it stops acknowledging before a new
# primary takes over, and its one-sided READs stop serving old values.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_isolate
