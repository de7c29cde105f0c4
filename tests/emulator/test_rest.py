"""The REST surface on the wire: the proto3 JSON mapping, Google's error bodies, paging, and
one state shared with the gRPC surface. (The client's life cycle over REST is test_api.)"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from google.api_core import exceptions

from emulator.rest_api import compile_template
from tests.emulator.conftest import PARENT, PROJECT, ZONE, create_ready, node_msg


def call(emu, verb: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(f"{emu.rest_url}{path}", data=data, method=verb, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_one_state_and_the_proto3_json_mapping(emu, client, user_key):
    node = create_ready(client, user_key, "both", "v4-8")  # over gRPC (single host: it can be stopped)
    status, got = call(emu, "GET", f"/v2/{node.name}?alt=json")
    assert status == 200
    assert got["name"] == node.name and got["acceleratorType"] == "v4-8"  # camelCase names
    assert got["state"] == "READY" and got["health"] == "HEALTHY"  # enums by name
    assert got["id"] == str(node.id)  # int64 as a string
    assert got["createTime"].endswith("Z") and got["createTime"].startswith(time.strftime("%Y-", time.gmtime()))
    assert [ep["port"] for ep in got["networkEndpoints"]] == emu.host_ports("both")
    assert got["networkEndpoints"][0]["accessConfig"] == {"externalIp": "127.0.0.1"}
    _, numeric = call(emu, "GET", f"/v2/{node.name}?%24alt=json%3Benum-encoding%3Dint")
    assert numeric["state"] == 2 and numeric["health"] == 1  # as the Python REST client asks

    status, op = call(emu, "POST", f"/v2/{node.name}:stop", {})
    assert status == 200 and op["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    assert op["metadata"]["verb"] == "stop" and op["metadata"]["target"] == node.name
    deadline = time.monotonic() + 30
    while not op.get("done") and time.monotonic() < deadline:
        time.sleep(0.05)
        _, op = call(emu, "GET", f"/v2/{op['name']}")
    assert op["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node" and op["response"]["state"] == "STOPPED"
    assert client.get_node(name=node.name).state.name == "STOPPED"  # and gRPC sees it


def test_errors_are_googles_json_error_bodies(emu, client, user_key):
    create_ready(client, user_key, "taken")
    missing = f"{PARENT}/nodes/missing"
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "NOT_FOUND", "domain": "tpu.googleapis.com"}
    assert call(emu, "GET", f"/v2/{missing}") == (404, {"error": {"code": 404, "message": f"Resource '{missing}' was not found",
                                                                  "status": "NOT_FOUND", "details": [info]}})
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}
    status, err = call(emu, "POST", f"/v2/{PARENT}/nodes?nodeId=taken", body)
    assert (status, err["error"]["status"]) == (409, "ALREADY_EXISTS")
    status, err = call(emu, "POST", f"/v2/{PARENT}/nodes?nodeId=x&colour=red", body)
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT") and 'Unknown name "colour"' in err["error"]["message"]
    status, err = call(emu, "POST", f"/v2/{PARENT}/nodes?nodeId=x", {**body, "colour": "red"})
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT") and "colour" in err["error"]["message"]
    for bad in (b"{not json", b"[1]"):
        status, err = call(emu, "POST", f"/v2/{PARENT}/nodes?nodeId=x", bad)
        assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT") and err["error"]["message"].startswith("Invalid JSON payload received.")
    status, err = call(emu, "POST", f"/v2/{PARENT}/nodes/taken:start", {})
    assert (status, err["error"]["status"]) == (400, "FAILED_PRECONDITION")  # code.proto: 400, not 412

    emu.set_capacity(ZONE, "v4", 0)
    status, op = call(emu, "POST", f"/v2/{PARENT}/nodes?nodeId=big", body)
    assert status == 200 and op["done"] is True  # a stock-out is the operation's error, as on Google Cloud
    assert op["error"]["code"] == 8 and "no more capacity" in op["error"]["message"]

    # outside the v2 surface: the alpha track's v2alpha1, the TPU Node API's v1 nodes, a verb
    for verb, path in [("GET", f"/v2alpha1/{PARENT}/nodes"), ("GET", f"/v1/{PARENT}/nodes"), ("PUT", f"/v2/{PARENT}/nodes/taken")]:
        status, err = call(emu, verb, path, {} if verb == "PUT" else None)
        assert (status, err["error"]["status"]) == (501, "UNIMPLEMENTED"), path
        assert f"does not implement {verb} {path}" in err["error"]["message"] and "Cloud TPU v2 API" in err["error"]["message"]


def test_paging_over_rest_and_the_v1_paths_gcloud_uses(emu, user_key):
    rest = emu.client("rest")
    try:
        for i in range(3):
            rest.create_node(parent=PARENT, node_id=f"n{i}", node=node_msg(user_key)).result(timeout=60)
        pages = list(rest.list_nodes(request={"parent": PARENT, "page_size": 2}).pages)
        assert [[n.name.rsplit("/", 1)[1] for n in p.nodes] for p in pages] == [["n0", "n1"], ["n2"]]
        assert pages[0].next_page_token and not pages[1].next_page_token
        with pytest.raises(exceptions.NotFound):
            rest.get_operation(request={"name": f"{PARENT}/operations/nope"})
    finally:
        rest.transport.close()
    _, page = call(emu, "GET", f"/v2/{PARENT}/acceleratorTypes?pageSize=3&alt=json")
    assert len(page["acceleratorTypes"]) == 3 and page["nextPageToken"]
    # `gcloud compute tpus locations|accelerator-types` call v1 for these; same answers
    _, v1 = call(emu, "GET", f"/v1/projects/{PROJECT}/locations?alt=json")
    assert call(emu, "GET", f"/v2/projects/{PROJECT}/locations?alt=json")[1] == v1
    assert {"name": f"{PARENT}", "locationId": ZONE} in v1["locations"]
    assert call(emu, "GET", f"/v1/{PARENT}/acceleratorTypes/v4-32")[1] == {
        "name": f"{PARENT}/acceleratorTypes/v4-32", "type": "v4-32", "acceleratorConfigs": [{"type": "V4", "topology": "2x2x4"}]}


def test_path_templates():
    pattern, fields = compile_template("/v2/{node.name=projects/*/locations/*/nodes/*}")
    assert fields == ("node.name",) and pattern.fullmatch("/v2/projects/p/locations/z/nodes/n").groups() == ("projects/p/locations/z/nodes/n",)
    pattern, fields = compile_template("/v2/{name=projects/*/locations/*/nodes/*}:start")
    assert pattern.fullmatch("/v2/projects/p/locations/z/nodes/n:start").group(1).endswith("/nodes/n")
    assert not pattern.fullmatch("/v2/projects/p/locations/z/nodes/n") and not pattern.fullmatch("/v2/projects/p/locations/z/nodes/a/b:start")
    pattern, _ = compile_template("/v2/{name=projects/*/locations/*/nodes/*}")
    assert not pattern.fullmatch("/v2/projects/p/locations/z/nodes/n:start")  # a verb is not an id
