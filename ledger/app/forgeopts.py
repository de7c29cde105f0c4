"""`ledger watch` / `ledger ingest` options for a forge (GitHub, GitLab): its API for reviews,
GitHub's web-flow keys, and the webhook receiver. Every option has its env var."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from ledger.app.optiontypes import FC
from ledger.errors import UsageError
from ledger.forge.github import GitHubForge
from ledger.forge.webflow import WebFlowKeys


def forge_options(fn: FC) -> FC:
    for option in reversed([
        click.option("--forge", type=click.Choice(["github"]), envvar="LEDGER_FORGE", default=None,
                     help="Ask this forge for merged pull requests' reviews (approval evidence) [env: LEDGER_FORGE]."),
        click.option("--forge-repo", envvar="LEDGER_FORGE_REPO", default=None,
                     help="The jobs repository on the forge, owner/name [env: LEDGER_FORGE_REPO]."),
        click.option("--forge-url", envvar="LEDGER_FORGE_URL", default=None,
                     help="The forge's API root [env: LEDGER_FORGE_URL; default: https://api.github.com]."),
        click.option("--forge-token-file", type=click.Path(dir_okay=False, path_type=Path),
                     envvar="LEDGER_FORGE_TOKEN_FILE", default=None,
                     help="A file holding the API token (read access to pull requests) [env: LEDGER_FORGE_TOKEN_FILE; "
                          "or the token itself in LEDGER_FORGE_TOKEN]. Never logged."),
        click.option("--web-flow-keys", type=click.Path(dir_okay=False, path_type=Path), envvar="LEDGER_WEB_FLOW_KEYS",
                     default=None, help="Armored OpenPGP keys whose signatures count as GitHub's web-flow "
                                        "[env: LEDGER_WEB_FLOW_KEYS; default: GitHub's, shipped with tpu-ledger]."),
    ]):
        fn = option(fn)
    return fn


@dataclass
class ForgeSetup:
    forge: GitHubForge | None
    web_flow: WebFlowKeys


def _secret(path: Path | None, env: str, what: str) -> str | None:
    if path is not None:
        try:
            return path.read_text().strip() or None
        except OSError as exc:
            raise UsageError(f"cannot read the {what} file {path}: {exc.strerror}", hint="check its path and mode") from exc
    return os.environ.get(env) or None


def forge_setup(forge: str | None, forge_repo: str | None, forge_url: str | None, forge_token_file: Path | None,
                web_flow_keys: Path | None) -> ForgeSetup:
    keys = WebFlowKeys.from_file(web_flow_keys) if web_flow_keys else WebFlowKeys.shipped()
    if forge is None:
        return ForgeSetup(None, keys)
    if not forge_repo:
        raise UsageError("--forge needs the repository", hint="pass --forge-repo owner/name (or LEDGER_FORGE_REPO)")
    token = _secret(forge_token_file, "LEDGER_FORGE_TOKEN", "forge token")
    return ForgeSetup(GitHubForge(forge_repo, token, base_url=forge_url), keys)


def webhook_secret(path: Path | None) -> bytes:
    secret = _secret(path, "LEDGER_WEBHOOK_SECRET", "webhook secret")
    if not secret:
        raise UsageError("--webhook-listen needs the webhook's secret",
                         hint="pass --webhook-secret-file PATH (or set LEDGER_WEBHOOK_SECRET)")
    return secret.encode()


def listen_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--webhook-listen {text!r} is not HOST:PORT", hint="e.g. --webhook-listen 127.0.0.1:8731")
    return host.strip("[]"), int(port)
