#!/bin/sh
# tests/rxe/cluster-failover.sh: whole-host death over real RDMA (doc/testing.md
# "Whole-host death over Soft-RoCE").
# `make check-rxe-cluster` runs it in each of 3 Soft-RoCE VMs (tests/rxe/vm
# cluster): VM k runs rdmapsd member k on verbs://10.9.0.k, every partition
# with one backup on another VM; VM 1 also runs it_replica's async test
# attached to those servers: workers push and pull, and once 150 pushes are
# acknowledged VM 2 or 3 (whichever does not lead Raft; RPS_IT_VICTIM=leader:
# the one that does, member 1 handing its leadership to member 2 first if it
# leads) is killed whole, its QEMU SIGKILLed by the host: no
# TCP reset, no CM disconnect reaches anyone; its
# peers see only RDMA retries running out and Raft silence.  The test asserts
# that every worker finishes without an error and every element and version
# equals the number of pushes acknowledged, and prints kill-to-first-ack (a
# push started after the kill, acknowledged: the new primary took it) and
# kill-to-done.  Exit status: it_replica's (VM 1's).
set -u
k=${RXE_VM_INDEX:?run by tests/rxe/vm cluster}
ctl=${RXE_CLUSTER_CTL:?}
# the cluster key the host made for the three VMs (make check-rxe-cluster)
RDMAPS_KEY_FILE=$ctl/cluster.key
export RDMAPS_KEY_FILE
port=7470
servers=verbs://10.9.0.1:$port,verbs://10.9.0.2:$port,verbs://10.9.0.3:$port
# it_replica's server arguments, with Raft's tick and the failover time
# for 3 software-emulated VMs sharing 2 cores (defaults: 50 ms, 1 s)
RPS_FAULT=bootstrap-replicas-2 ./rdmapsd --listen "verbs://10.9.0.$k:$port" --cluster "$servers" \
	--index $((k - 1)) --data-dir /tmp/rdmapsd --partitions 8 --shard-size 4096 --slots 4 \
	--tick-ms 50 --failover-ms 1000 --fsync none --log-level info \
	> "$ctl/rdmapsd.$k.log" 2>&1 &
server=$!
if [ "$k" != 1 ]; then
	wait "$server"	# until the host kills this VM, or VM 1 is done
	exit 0
fi
# member $1's VM: ask the host to kill it, return once it is dead
hook='touch "$RXE_CLUSTER_CTL/kill.$1"; while [ ! -e "$RXE_CLUSTER_CTL/killed.$1" ]; do sleep 0.05; done'
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$RXE_ADDR RPS_IT_ATTACH=$servers RPS_IT_KILL_HOOK=$hook \
	RPS_TEST_ONLY="async: a primary killed mid-push" ./tests/it_replica
rc=$?
kill -0 "$server" 2>/dev/null || { echo "cluster-failover: rdmapsd 1 died"; rc=1; }
exit $rc
