"""The dashboard's JSON answers (FastJSONResponse) say what Starlette's JSONResponse says.
Pure: no server."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from ledger.app.dashboard.responses import FastJSONResponse

_SCALARS = st.none() | st.booleans() | st.integers() | st.text()
_VALUES = st.recursive(_SCALARS | st.floats(allow_nan=False, allow_infinity=False),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                       max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_the_same_json_values(value):
    assert json.loads(FastJSONResponse(value).body) == json.loads(JSONResponse(value).body)


@settings(max_examples=200, deadline=None)
@given(st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=20))
def test_the_same_bytes_without_floats(value):
    response = FastJSONResponse(value, status_code=201)
    assert response.body == JSONResponse(value).body
    assert response.status_code == 201 and response.media_type == "application/json"
