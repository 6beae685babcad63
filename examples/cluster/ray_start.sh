#!/usr/bin/env bash
# Start Ray on one node of a multi-node job (docs/cluster.md, "Multi-node").
#
#   bash examples/cluster/ray_start.sh head                  on the head node (the one that will run launch.sh)
#   bash examples/cluster/ray_start.sh worker HEAD_IP        on every other node
#   ray stop                                                 to leave the cluster
#
# GPUS_PER_NODE (default 8) GPUs are declared per node. NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, when set, name the
# network interface the nodes reach each other on (e.g. eth0, ib0); Ray's workers inherit the environment of
# `ray start`, so set them here, not only in the launching shell.
#
# Security (docs/security.md): Ray's ports run submitted code for anyone who reaches them. Run the nodes on a private
# network or behind a firewall that admits only the other nodes; the dashboard listens on 127.0.0.1 only, seen from
# your machine through `ssh -L 8265:127.0.0.1:8265 user@HEAD_IP`. Ray >= 2.52 authenticates its ports when
# RAY_AUTH_MODE=token is exported on every node before `ray start`, with the same token everywhere (RAY_AUTH_TOKEN, or
# the file ~/.ray/auth_token that `ray get-auth-token --generate` writes).
set -euo pipefail

role=${1:-}
gpus=${GPUS_PER_NODE:-8}
port=${RAY_PORT:-6379}
case $role in
    head)
        ray start --head --port="$port" --num-gpus="$gpus" --dashboard-host=127.0.0.1 --dashboard-port=8265
        echo "workers join with: bash examples/cluster/ray_start.sh worker $(hostname -I | awk '{print $1}')"
        ;;
    worker)
        head_ip=${2:?usage: $0 worker HEAD_IP}
        ray start --address="$head_ip:$port" --num-gpus="$gpus"
        ;;
    *)
        echo "usage: $0 head | worker HEAD_IP" >&2
        exit 2
        ;;
esac
ray status
