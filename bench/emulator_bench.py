"""Emulator benchmark: a v6e-256 (64 hosts) from create_node to every host answering SSH.

    python bench/emulator_bench.py [--runs 3] [--accelerator v6e-256] [--json]

Per run: start an emulator, create the node with the real google-cloud-tpu client and wait
for the operation (READY), then connect to every host with paramiko, pinning the host key
from guest attributes, and run `echo $TPU_WORKER_ID`; then get_node the big node 100 times
over gRPC and over REST, and (where gcloud is installed) time `gcloud compute tpus tpu-vm
describe` against it 3 times; then delete the node. Target: all 64 hosts reachable in under
10 s from the create call. Medians are quoted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paramiko  # noqa: E402
from google.cloud.tpu_v2.types import cloud_tpu as T  # noqa: E402

from emulator import Emulator, Timings  # noqa: E402

PARENT = "projects/bench/locations/us-east1-d"


def _ssh(ep, key_b64: str, user_key: paramiko.PKey, worker: int) -> str:
    ssh = paramiko.SSHClient()
    ssh.get_host_keys().add(f"[{ep.ip_address}]:{ep.port}", "ecdsa-sha2-nistp256", paramiko.ECDSAKey(data=base64.b64decode(key_b64)))
    ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
    ssh.connect(ep.ip_address, port=ep.port, username="bench", pkey=user_key, look_for_keys=False, allow_agent=False, timeout=30, banner_timeout=30, auth_timeout=30)
    try:
        _, out, _ = ssh.exec_command("echo $TPU_WORKER_ID")
        text = out.read().decode().strip()
        assert out.channel.recv_exit_status() == 0 and text == str(worker), text
        return text
    finally:
        ssh.close()


def _median_s(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gcloud_describe(emu: Emulator, node_id: str, config_dir: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(emu.gcloud_env("bench"), CLOUDSDK_CONFIG=config_dir)
    zone = PARENT.rsplit("/", 1)[1]
    subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", "describe", node_id, f"--zone={zone}", "--format=value(state)"], env=env, check=True, capture_output=True, timeout=60)


def one_run(accel: str, create_delay: float) -> dict[str, float]:
    user_key = paramiko.ECDSAKey.generate(bits=256)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        emu = Emulator(state_dir=tmp, timings=Timings(create=create_delay)).start()
        t_start = time.perf_counter() - t0
        client = emu.client()
        try:
            node = T.Node(accelerator_type=accel, runtime_version="v2-alpha-tpuv6e", metadata={"ssh-keys": f"bench:{user_key.get_name()} {user_key.get_base64()} bench"})
            t0 = time.perf_counter()
            op = client.create_node(parent=PARENT, node_id="big", node=node)
            # poll the node itself rather than the operation: the client's LRO poll sleeps ~1 s
            while client.get_node(name=f"{PARENT}/nodes/big").state != T.Node.State.READY:
                time.sleep(0.02)
            t_ready = time.perf_counter() - t0
            node = client.get_node(name=f"{PARENT}/nodes/big")
            attrs = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"}).guest_attributes
            keys = [a.query_value.items[0].value for a in attrs]
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda i: _ssh(node.network_endpoints[i], keys[i], user_key, i), range(len(node.network_endpoints))))
            t_all = time.perf_counter() - t0
            op.result(timeout=60)
            rest = emu.client("rest")
            try:
                get_grpc = _median_s(lambda: client.get_node(name=node.name), 100)
                get_rest = _median_s(lambda: rest.get_node(name=node.name), 100)
            finally:
                rest.transport.close()
            gcloud = _median_s(lambda: _gcloud_describe(emu, "big", f"{tmp}/gcloud"), 3) if shutil.which("gcloud") else float("nan")
            hosts = len(node.network_endpoints)
            t0 = time.perf_counter()
            client.delete_node(name=node.name)
            while any(True for _ in client.list_nodes(parent=PARENT)):
                time.sleep(0.02)
            t_delete = time.perf_counter() - t0
        finally:
            client.transport.close()
            t0 = time.perf_counter()
            emu.stop()
            t_stop = time.perf_counter() - t0
    return {"hosts": hosts, "start_s": t_start, "ready_s": t_ready, "all_ssh_s": t_all, "get_grpc_s": get_grpc, "get_rest_s": get_rest, "gcloud_describe_s": gcloud, "delete_s": t_delete, "stop_s": t_stop}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--accelerator", default="v6e-256")
    ap.add_argument("--create-delay", type=float, default=0.3, help="emulated CREATING time (default 0.3 s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = [one_run(args.accelerator, args.create_delay) for _ in range(args.runs)]
    keys = ["start_s", "ready_s", "all_ssh_s", "get_grpc_s", "get_rest_s", "gcloud_describe_s", "delete_s", "stop_s"]
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    result = {
        "accelerator": args.accelerator,
        "hosts": runs[0]["hosts"],
        "runs": args.runs,
        "create_delay_s": args.create_delay,
        "median": med,
        "max": {k: max(r[k] for r in runs) for k in keys},
        "rest_over_grpc_get": med["get_rest_s"] / med["get_grpc_s"],
        "target_all_ssh_s": 10.0,
        "met": med["all_ssh_s"] < 10.0,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.accelerator}: {result['hosts']} hosts, {args.runs} runs, create delay {args.create_delay} s")
    print(f"{'measure':<34}{'median s':>10}{'max s':>10}")
    labels = {
        "start_s": "emulator start",
        "ready_s": "create_node -> READY",
        "all_ssh_s": "create_node -> all hosts SSH ok",
        "get_grpc_s": "get_node over gRPC",
        "get_rest_s": "get_node over REST",
        "gcloud_describe_s": "gcloud tpu-vm describe (process)",
        "delete_s": "delete_node -> gone",
        "stop_s": "emulator stop",
    }
    for k in keys:
        print(f"{labels[k]:<34}{med[k]:>10.4f}{result['max'][k]:>10.4f}")
    print(f"get_node REST / gRPC: {result['rest_over_grpc_get']:.2f}x (same node, same run)")
    print(f"target: all hosts reachable < 10 s: {'met' if result['met'] else 'MISSED'}")


if __name__ == "__main__":
    main()
