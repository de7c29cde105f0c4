"""Shared fixtures for the job-spec tests: the template's repo config and fixture folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.resources import template_dir
from ledger.spec.config import RepoConfig, load_repo_config

TEMPLATE_DIR = Path(str(template_dir()))  # a folder: the tests run from the source tree

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def config() -> RepoConfig:
    """The configuration every new jobs repository starts with (jobs-repo-template/.ledger/)."""
    cfg = load_repo_config(TEMPLATE_DIR)
    assert cfg.errors == ()
    return cfg
