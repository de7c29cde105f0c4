"""The schemas are valid 2020-12 schemas, and the fast check (jsonschema-rs) agrees with jsonschema."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.resources import schema_file, template_dir
from ledger.spec.schema import is_valid, load_schema, validator
from ledger.spec.yamlsafe import LoadError, load

TEMPLATE_DIR = Path(str(template_dir()))  # a folder: the tests run from the source tree

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["job", "aliases", "policy"])
def test_schema_is_valid_2020_12(name):
    schema = json.loads(schema_file(name).read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert is_valid(name, {}) == validator(name).is_valid({})


def documents() -> list:
    out = []
    for path in sorted([*FIXTURES.rglob("*.yaml"), *(TEMPLATE_DIR / "jobs").rglob("*.yaml")]):
        try:
            data = load(path.read_bytes()).data
        except LoadError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


DOCS = documents()

# Values that poke at type edges: bool vs int, float vs int, empty, wrong containers.
ODD_VALUES = [True, False, 0, 1, -1, 1.0, 1.5, "", "all", "x", None, [], [0], [0, 0], {}, {"a": 1}, "v4-8", 10**6]


def test_fast_check_agrees_on_every_fixture():
    assert len(DOCS) > 30
    for doc in DOCS:
        assert is_valid("job", doc) == validator("job").is_valid(doc), doc


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_fast_check_agrees_on_mutations(seed):
    rng = random.Random(seed)
    doc = copy.deepcopy(rng.choice(DOCS))
    for _ in range(rng.randint(1, 3)):
        # Walk to a random container and replace, add or delete one entry.
        node = doc
        for _ in range(rng.randint(0, 3)):
            children = [v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, (dict, list)) and v]
            if not children:
                break
            node = rng.choice(children)
        value = copy.deepcopy(rng.choice(ODD_VALUES))
        if isinstance(node, dict):
            keys = list(node)
            if keys and rng.random() < 0.8:
                key = rng.choice(keys)
                if rng.random() < 0.2:
                    del node[key]
                else:
                    node[key] = value
            else:
                node[rng.choice(["extra", "cmd", "workers", "rule", "zone"])] = value
        elif node:
            node[rng.randrange(len(node))] = value
    assert is_valid("job", doc) == validator("job").is_valid(doc), doc


@pytest.mark.parametrize("name", ["aliases", "policy"])
def test_fast_check_agrees_on_repo_config(name):
    data = load((TEMPLATE_DIR / ".ledger" / f"{name}.yaml").read_bytes()).data
    assert is_valid(name, data) and validator(name).is_valid(data)
    schema = load_schema(name)
    for key in schema["properties"]:
        for odd in ODD_VALUES:
            doc = {**data, key: odd}
            assert is_valid(name, doc) == validator(name).is_valid(doc), doc
