"""The emulator's REST surface against Google's own definition of the Cloud TPU v2 API: the
discovery document google-api-python-client ships (tpu.v2.json), and a client built from it
(a second client, independent of google-cloud-tpu). Every response is checked against the
document's schemas: no field it does not define, every enum value one it lists."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import googleapiclient
import httplib2
import pytest
from googleapiclient.discovery import build_from_document
from googleapiclient.errors import HttpError

from tests.emulator.conftest import PARENT, PROJECT, ssh_keys_line

DOC = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents" / "tpu.v2.json").read_text())
SCHEMAS = DOC["schemas"]


def conforms(value: Any, schema: dict, path: str = "$") -> None:
    """`value` fits `schema` (a discovery schema): known fields only, right types, listed enums."""
    if "$ref" in schema:
        schema = SCHEMAS[schema["$ref"]]
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), f"{path}: not an object"
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, sub in value.items():
            if key == "@type":  # an Any (an operation's response or metadata) names its type
                continue
            if key in props:
                conforms(sub, props[key], f"{path}.{key}")
            else:
                assert extra is not None, f"{path}.{key}: not in Google's definition"
                conforms(sub, extra, f"{path}.{key}")
    elif kind == "array":
        assert isinstance(value, list), f"{path}: not a list"
        for i, item in enumerate(value):
            conforms(item, schema["items"], f"{path}[{i}]")
    elif kind == "string":
        assert isinstance(value, str), f"{path}: not a string"
        if "enum" in schema:
            assert value in schema["enum"], f"{path}: {value!r} is not one of {schema['enum']}"
    elif kind == "integer":
        assert isinstance(value, int), f"{path}: not an integer"
    elif kind == "boolean":
        assert isinstance(value, bool), f"{path}: not a boolean"


def fits(value: Any, name: str) -> Any:
    conforms(value, {"$ref": name})
    return value


def method(name: str) -> dict:
    """A method of projects.locations, by its path below it ("nodes.create")."""
    node: dict = DOC["resources"]["projects"]["resources"]["locations"]
    *path, verb = name.split(".")
    for part in path:
        node = node["resources"][part]
    return node["methods"][verb]


def response_of(name: str) -> str:
    return method(name)["response"]["$ref"]


@pytest.fixture
def api(emu):
    svc = build_from_document(DOC, http=httplib2.Http(timeout=30), client_options={"api_endpoint": emu.rest_url + "/"})
    yield svc.projects().locations()
    svc.close()


def wait_op(api, op: dict) -> dict:
    deadline = time.monotonic() + 30
    while not op.get("done") and time.monotonic() < deadline:
        time.sleep(0.05)
        op = fits(api.operations().get(name=op["name"]).execute(), "Operation")
    assert op.get("done"), op
    return op


def refused(request) -> dict:
    with pytest.raises(HttpError) as caught:
        request.execute()
    body = json.loads(caught.value.content)["error"]
    info = [d for d in body.get("details", []) if d.get("@type") == "type.googleapis.com/google.rpc.ErrorInfo"]
    assert info and info[0]["reason"] and info[0]["domain"], body  # google.rpc.ErrorInfo, as Google sends it
    return body


def test_every_method_answers_in_the_shapes_google_defines(api, user_key):
    node = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "metadata": {"ssh-keys": ssh_keys_line(user_key)}}
    op = fits(api.nodes().create(parent=PARENT, nodeId="d1", body=node).execute(), response_of("nodes.create"))
    done = wait_op(api, op)
    created = fits(done["response"], "Node")
    for field in ("schedulingConfig", "networkConfig", "shieldedInstanceConfig", "cidrBlock", "serviceAccount"):
        assert field in created, f"a node the real API returns always has {field}"
    assert created["acceleratorConfig"] == {"type": "V4", "topology": "2x2x1"}
    assert created["networkConfig"]["network"] == f"projects/{PROJECT}/global/networks/default"
    name = created["name"]
    fits(api.nodes().get(name=name).execute(), "Node")
    fits(api.nodes().list(parent=PARENT).execute(), response_of("nodes.list"))
    fits(api.nodes().getGuestAttributes(name=name, body={"queryPath": "hostkeys/"}).execute(), response_of("nodes.getGuestAttributes"))
    fits(wait_op(api, api.nodes().patch(name=name, updateMask="labels", body={"labels": {"a": "b"}}).execute())["response"], "Node")
    assert wait_op(api, api.nodes().stop(name=name, body={}).execute())["response"]["state"] == "STOPPED"
    assert wait_op(api, api.nodes().start(name=name, body={}).execute())["response"]["state"] == "READY"
    accel = fits(api.acceleratorTypes().list(parent=PARENT).execute(), response_of("acceleratorTypes.list"))
    assert all(t["acceleratorConfigs"] and t["acceleratorConfigs"][0]["topology"] for t in accel["acceleratorTypes"])
    fits(api.acceleratorTypes().get(name=f"{PARENT}/acceleratorTypes/v4-32").execute(), "AcceleratorType")
    versions = fits(api.runtimeVersions().list(parent=PARENT).execute(), response_of("runtimeVersions.list"))
    fits(api.runtimeVersions().get(name=versions["runtimeVersions"][0]["name"]).execute(), "RuntimeVersion")
    fits(api.list(name=f"projects/{PROJECT}").execute(), response_of("list"))
    fits(api.get(name=PARENT).execute(), "Location")
    fits(api.generateServiceIdentity(parent=PARENT, body={}).execute(), response_of("generateServiceIdentity"))
    fits(api.operations().list(name=PARENT).execute(), response_of("operations.list"))
    qr = {"tpu": {"nodeSpec": [{"parent": PARENT, "nodeId": "q1", "node": {"acceleratorType": "v4-8",
                                                                         "runtimeVersion": "tpu-ubuntu2204-base"}}]}}
    wait_op(api, api.queuedResources().create(parent=PARENT, queuedResourceId="qr1", body=qr).execute())
    fits(api.queuedResources().get(name=f"{PARENT}/queuedResources/qr1").execute(), "QueuedResource")
    fits(api.queuedResources().list(parent=PARENT).execute(), response_of("queuedResources.list"))
    wait_op(api, api.queuedResources().delete(name=f"{PARENT}/queuedResources/qr1", force=True).execute())
    assert wait_op(api, api.nodes().delete(name=name).execute())["done"]


def test_runtime_versions_are_per_zone_and_an_unknown_or_foreign_one_is_refused(api):
    def versions(zone: str) -> set[str]:
        listed = api.runtimeVersions().list(parent=f"projects/{PROJECT}/locations/{zone}").execute()
        return {v["version"] for v in listed["runtimeVersions"]}

    assert "v2-alpha-tpuv5-lite" in versions("us-west4-a") and "v2-alpha-tpuv5-lite" not in versions("us-central2-b")
    assert "tpu-vm-v4-base" in versions("us-central2-b") and "tpu-vm-v4-base" not in versions("us-west4-a")
    for runtime in ("tpu-vm-tf-9.9.9", "v2-alpha-tpuv5-lite"):  # unknown; of another generation
        body = refused(api.nodes().create(parent=PARENT, nodeId="bad", body={"acceleratorType": "v4-8", "runtimeVersion": runtime}))
        assert (body["code"], body["status"]) == (400, "INVALID_ARGUMENT") and runtime in body["message"]


def test_stop_is_refused_on_a_multi_host_slice(api):
    op = api.nodes().create(parent=PARENT, nodeId="pod", body={"acceleratorType": "v4-32", "runtimeVersion": "tpu-vm-v4-base"}).execute()
    name = wait_op(api, op)["response"]["name"]
    body = refused(api.nodes().stop(name=name, body={}))
    assert body["status"] == "INVALID_ARGUMENT" and "single TPU nodes" in body["message"]


def test_filter_fields_and_page_tokens(api):
    listed = api.acceleratorTypes().list(parent=PARENT, filter='type="v4-32"').execute()
    assert [t["type"] for t in listed["acceleratorTypes"]] == ["v4-32"]
    partial = api.acceleratorTypes().list(parent=PARENT, fields="acceleratorTypes(type)").execute()
    assert partial["acceleratorTypes"] and all(set(t) == {"type"} for t in partial["acceleratorTypes"])
    page = api.runtimeVersions().list(parent=PARENT, pageSize=2).execute()
    assert len(page["runtimeVersions"]) == 2 and page["nextPageToken"]
    api.runtimeVersions().list(parent=PARENT, pageSize=2, pageToken=page["nextPageToken"]).execute()
    assert refused(api.runtimeVersions().list(parent=PARENT, pageToken="not-a-token"))["status"] == "INVALID_ARGUMENT"
    assert refused(api.acceleratorTypes().list(parent=PARENT, filter="type ~~ v4"))["status"] == "INVALID_ARGUMENT"


def test_injected_faults_and_an_outage_answer_with_google_rpc_details(emu, api):
    emu.fail_calls("ListNodes", "PERMISSION_DENIED")
    body = refused(api.nodes().list(parent=PARENT))
    assert body["status"] == "PERMISSION_DENIED"
    info = body["details"][0]
    assert (info["reason"], info["domain"], info["metadata"]["permission"]) == ("IAM_PERMISSION_DENIED", "iam.googleapis.com", "tpu.nodes.list")
    emu.outage("refuse")
    assert refused(api.nodes().list(parent=PARENT))["status"] == "UNAVAILABLE"
    emu.outage(None)
    api.nodes().list(parent=PARENT).execute()
