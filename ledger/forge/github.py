"""GitHub as a forge: a merged pull request's reviews, from GitHub's REST API (githubkit).

One call per pull request: `GET /repos/{owner}/{repo}/pulls/{number}/reviews` (100 a page,
more pages only for a pull request with over 100 reviews). The merged head commit comes
from git (a merge commit's second parent) or from the webhook that announced the merge
(`note_merged`); only a squash merge announced by no webhook costs a second call
(`GET /repos/{owner}/{repo}/pulls/{number}`) to learn it. Answers are cached by
(number, head commit): an ingest that reads a commit twice, or several watchers' plans,
never ask again.

The token comes from the environment or a file (LEDGER_FORGE_TOKEN, --forge-token-file)
and is never logged: it goes to githubkit only, and errors name the request, not the auth.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ledger import defaults
from ledger.errors import LedgerError
from ledger.forge.reviews import PullReviews, Review

API_URL = "https://api.github.com"


class ForgeError(LedgerError):
    """The forge could not be asked (network, auth, rate limit): not the commit's fault, so
    the watcher retries with backoff and decides nothing meanwhile."""


class GitHubForge:
    name = "github"

    def __init__(self, repository: str, token: str | None = None, *, base_url: str | None = None,
                 cache_size: int = defaults.FORGE_CACHE_SIZE) -> None:
        owner, _, repo = repository.strip().strip("/").partition("/")
        if not owner or not repo or "/" in repo:
            raise LedgerError(f"{repository!r} is not a GitHub repository", hint="give owner/name, e.g. lab/jobs")
        from githubkit import (  # heavy: only when a forge is used
            GitHub,
            TokenAuthStrategy,
            UnauthAuthStrategy,
        )

        auth = TokenAuthStrategy(token) if token else UnauthAuthStrategy()
        self.owner, self.repo = owner, repo
        self._github = GitHub(auth, base_url=base_url or API_URL, timeout=30.0, auto_retry=False)
        self._cache: OrderedDict[tuple[int, str], PullReviews] = OrderedDict()
        self._heads: dict[int, str] = {}  # number -> merged head, from webhooks
        self._size = cache_size
        self._lock = threading.Lock()
        self.calls = 0  # API requests made (the benchmark and tests read it)

    def __repr__(self) -> str:  # never the token
        return f"GitHubForge({self.owner}/{self.repo})"

    def note_merged(self, number: int, head: str) -> None:
        """A webhook said pull request `number` was merged at `head`: no call needed to learn it."""
        with self._lock:
            self._heads[number] = head
            if len(self._heads) > self._size:
                self._heads.pop(next(iter(self._heads)))

    def reviews(self, number: int, head: str | None) -> PullReviews:
        with self._lock:
            head = head or self._heads.get(number)
            cached = self._cache.get((number, head)) if head else None
        if cached is not None:
            return cached
        if head is None:
            head = self._pull_head(number)
            if head is None:
                return PullReviews(number, None)
            with self._lock:
                cached = self._cache.get((number, head))
            if cached is not None:
                return cached
        found = PullReviews(number, head, tuple(self._list_reviews(number)))
        with self._lock:
            self._cache[(number, head)] = found
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return found

    def _list_reviews(self, number: int) -> list[Review]:
        out: list[Review] = []
        page = 1
        while True:
            data = self._call(self._github.rest.pulls.list_reviews, self.owner, self.repo, number,
                              per_page=100, page=page)
            if data is None:
                return out
            for r in data:
                if r.user is None:
                    continue  # a deleted account reviews nothing
                at = r.submitted_at.isoformat() if r.submitted_at else ""
                out.append(Review(r.user.login, r.state, r.commit_id, at))
            if len(data) < 100:
                return out
            page += 1

    def _pull_head(self, number: int) -> str | None:
        pull = self._call(self._github.rest.pulls.get, self.owner, self.repo, number)
        return pull.head.sha if pull is not None and pull.merged_at else None

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """The parsed (and so validated) answer, None for 404; ForgeError otherwise."""
        from githubkit.exception import GitHubException, RequestFailed
        from pydantic import ValidationError

        self.calls += 1
        try:
            return method(*args, **kwargs).parsed_data
        except RequestFailed as exc:
            if exc.response.status_code == 404:
                return None
            raise ForgeError(f"GitHub answered {exc.response.status_code} for {self.owner}/{self.repo} "
                             f"pull request reviews", hint="check the token's access to the repository") from None
        except ValidationError:
            raise ForgeError(f"GitHub's answer for {self.owner}/{self.repo} does not fit its API description",
                             hint="check LEDGER_FORGE_URL points at a GitHub API") from None
        except GitHubException as exc:
            raise ForgeError(f"cannot reach GitHub for {self.owner}/{self.repo}: {type(exc).__name__}",
                             hint="check LEDGER_FORGE_URL and the network; the watcher retries") from None
