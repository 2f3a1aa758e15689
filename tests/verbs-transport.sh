#!/bin/sh
# The transport contract suite (tests/test_transport.c) on a real verbs device.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_TRANSPORT=verbs RPS_TEST_ADDR=$addr exec ./tests/test_transport
