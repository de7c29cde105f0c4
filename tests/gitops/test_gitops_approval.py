"""The approval rules, as pure functions (no git needed): CODEOWNERS as GitHub documents it,
teams, trailers, pull-request numbers and signatures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.gitops.approval import (
    Evidence,
    Identity,
    Signature,
    evaluate,
    parse_identity,
    pull_request_number,
)
from ledger.spec.codeowners import parse_codeowners
from ledger.spec.config import load_repo_config
from ledger.spec.files import config_results
from ledger.spec.policy import Policy, parse_policy

ALICE = Identity("Alice Ng", "alice@lab.org")
BOB = Identity("Bob Li", "bob@lab.org")


def policy(text: str) -> Policy:
    parsed, errors = parse_policy(text)
    assert errors == ()
    return parsed


RULES = parse_codeowners("* @admin\n/jobs/alice/ @bob carol@lab.org  # alice's reviewers\njobs/*/big.yaml @lead\n")

# GitHub's documented examples (docs.github.com, "About code owners"), one pattern each:
# (pattern, path, owned). The last three are the bugs of the hand-written matcher.
GITHUB = [
    ("*", "README.md", True),
    ("*", "a/b/c.py", True),
    ("*.js", "app.js", True),
    ("*.js", "src/deep/app.js", True),
    ("*.js", "app.ts", False),
    ("/build/logs/", "build/logs/x.log", True),
    ("/build/logs/", "build/logs/deep/x.log", True),
    ("/build/logs/", "src/build/logs/x.log", False),  # anchored at the root
    ("docs/*", "docs/getting-started.md", True),
    ("docs/*", "docs/build-app/troubleshooting.md", False),  # only direct children
    ("apps/", "apps/web/main.js", True),
    ("apps/", "x/apps/y", True),  # an apps directory anywhere
    ("apps/", "apps", False),  # a directory pattern owns what is inside
    ("/docs/", "docs/a/b.md", True),
    ("/docs/", "src/docs/a.md", False),
    ("**/logs", "build/logs/a", True),
    ("**/logs", "a/b/logs/c", True),
    ("**/logs", "deeply/nested/logs/x", True),
    ("**/logs", "logs/x", True),
    ("/scripts/", "scripts/run.sh", True),
    ("jobs/alice/*.yaml", "jobs/alice/x.yaml", True),
    ("jobs/alice/*.yaml", "jobs/alice/sub/x.yaml", False),
    ("/apps/github", "apps/github/x.js", True),
]


@pytest.mark.parametrize(("pattern", "path", "owned"), GITHUB)
def test_codeowners_patterns_follow_github(pattern, path, owned):
    assert parse_codeowners(f"{pattern} @owner\n").owners(path) == (("@owner",) if owned else ())


def test_codeowners_last_match_wins_and_an_ownerless_line_clears():
    assert RULES.owners("jobs/alice/a.yaml") == ("@bob", "carol@lab.org")
    assert RULES.owners("jobs/alice/big.yaml") == ("@lead",)
    assert RULES.owners("README.md") == ("@admin",)
    # GitHub's example: /apps/ is @octocat's except /apps/github, which has no owner
    apps = parse_codeowners("/apps/ @octocat\n/apps/github\n")
    assert apps.owners("apps/x.js") == ("@octocat",) and apps.owners("apps/github/x.js") == ()
    assert apps.rule_for("apps/github/x.js").line == 2


def test_codeowners_lines_github_skips_are_reported_and_skipped():
    owners = parse_codeowners("* @a\n!secret.txt @b\n*.[ch] @c\nsrc/ nobody\n*.go docs@example.com #go\n")
    assert [(m.line, m.column, m.message) for m in owners.problems] == [
        (2, 1, "`!secret.txt`: negation with `!` does not work in CODEOWNERS; GitHub skips this line"),
        (3, 1, "`*.[ch]`: character ranges `[ ]` do not work in CODEOWNERS; GitHub skips this line"),
        (4, 6, "'nobody' is not an owner: use @user, @org/team or an e-mail address; GitHub skips this line"),
    ]
    assert owners.owners("x.c") == ("@a",) and owners.owners("src/x.py") == ("@a",)
    assert owners.owners("main.go") == ("docs@example.com",)  # the inline comment is not an owner


def test_unknown_teams_are_policy_errors_with_their_line(tmp_path: Path):
    _, errors = parse_policy("teams:\n  lab/stewards: [sam@lab.org]\napproval:\n  approvers: ['@lab/stewards', '@lab/ghosts']\n")
    assert [(m.line, m.pointer, m.message) for m in errors] == [
        (4, "/approval/approvers/1", "@lab/ghosts is a team the policy does not define: nobody can approve for it")]
    # ... and from CODEOWNERS, found where GitHub looks (.github/ first), at its file:line:column
    (tmp_path / ".ledger").mkdir()
    (tmp_path / ".ledger/policy.yaml").write_text("teams:\n  '@lab/stewards': [sam@lab.org]\n")
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github/CODEOWNERS").write_text("* @lab/stewards\n/jobs/ @alice @lab/tpu-admins\n")
    (tmp_path / "CODEOWNERS").write_text("* @lab/not-read\n")
    [result] = config_results(load_repo_config(tmp_path))
    assert [m.format().splitlines()[0] for m in result.errors] == [
        ".github/CODEOWNERS:2:15: error: @lab/tpu-admins is a team the policy does not define: nobody can approve for it"]


def test_identity_tokens_match_handles_names_and_emails():
    who = parse_identity("Bob <bob@lab.org>")
    assert {"@bob", "bob@lab.org"} <= who.tokens()


def ev(message: str = "x", *, parents: int = 1, trailers=(), authors=(ALICE,), merger=None, signature=None) -> Evidence:
    return Evidence(message, parents, tuple(trailers), tuple(authors), merger, signature)


def approved_by(*who: Identity) -> list[tuple[str, str]]:
    return [("approved-by", w.display()) for w in who]


def test_trailers_count_distinct_non_author_owners():
    rules = policy("approval: {mode: trailers, required: 2}")
    carol = Identity("Carol", "carol@lab.org")
    trailers = [*approved_by(BOB, BOB), ("reviewed-by", carol.display()), ("signed-off-by", "A <a@x>")]
    ok = evaluate(rules, ev(trailers=trailers), "jobs/alice/a.yaml", RULES)
    assert ok.ok and ok.approvers == ("Bob Li <bob@lab.org>", "Carol <carol@lab.org>") and ok.via == "trailers"
    # carol wrote it: only bob remains, and two are required
    no = evaluate(rules, ev(trailers=trailers, authors=(carol,)), "jobs/alice/a.yaml", RULES)
    assert not no.ok and no.would_approve == ("@bob",)
    assert no.reason == "not approved: needs 1 more approval(s) from @bob"


def test_a_team_approves_through_its_members_and_never_through_the_author():
    rules = policy("teams:\n  lab/stewards: [Sam Steward, bob@lab.org]\napproval: {mode: trailers}\n")
    owners = parse_codeowners("/jobs/ @lab/stewards\n")
    sam = Identity("Sam Steward", "sam@lab.example")
    assert evaluate(rules, ev(trailers=approved_by(sam)), "jobs/alice/a.yaml", owners).approvers == (sam.display(),)
    # bob is a steward, but he wrote this one
    no = evaluate(rules, ev(trailers=approved_by(BOB), authors=(BOB,)), "jobs/bob/a.yaml", owners)
    assert no.reason == "not approved: needs 1 more approval(s) from Sam Steward"
    assert no.would_approve == ("Sam Steward",)
    # an undefined team has no members: nobody can approve, and the reason says why
    ghost = evaluate(rules, ev(trailers=approved_by(sam)), "x.yaml", parse_codeowners("* @lab/ghosts\n"))
    assert ghost.reason == ("not approved: needs 1 more approval(s) from an approver other than the author "
                            "(@lab/ghosts: not a team of the policy)")


def test_merge_commit_mode_needs_a_pull_request_number_and_records_the_merger():
    rules = policy("approval: {mode: merge-commit}")
    gh = evaluate(rules, ev("Merge pull request #7 from a/b\n\nx", parents=2, merger=BOB), "p", None)
    assert gh.ok and gh.pr == 7 and gh.approvers == ("Bob Li <bob@lab.org>",) and gh.via == "merge-commit"
    assert pull_request_number("Add thing (#12)", 1) == 12
    assert pull_request_number("Merge branch 'x'\n\nSee merge request lab/jobs!5", 2) == 5
    assert pull_request_number("Merge pull request #7 from a/b", 1) is None  # not a merge commit
    plain = evaluate(rules, ev("Approved-by: B <b@x>"), "p", None)
    assert plain.reason == "not approved: no merged pull request recorded in the merge commit"


SIGNED = "approval: {mode: either, signatures: required}\n"
MERGE = "Merge pull request #3 from alice/x"


@pytest.mark.parametrize(("signature", "reason"), [
    (None, "not approved: the commit is not signed, and approval.signatures is required"),
    (Signature("none"), "not approved: the commit is not signed, and approval.signatures is required"),
    (Signature("untrusted", key="SHA256:abc"),
     "not approved: the commit is signed by key SHA256:abc, which .ledger/allowed_signers does not list"),
    (Signature("bad", key="SHA256:abc", detail="Signature verification failed"),
     "not approved: the commit's signature does not verify (Signature verification failed)"),
    (Signature("good", "alice@lab.org", "SHA256:abc"),
     "not approved: the commit is signed by alice@lab.org, an author of the change: an author cannot approve it"),
])
def test_with_signatures_required_a_merge_counts_only_when_signed_by_a_non_author(signature, reason):
    got = evaluate(policy(SIGNED), ev(MERGE, parents=2, merger=BOB, signature=signature), "jobs/alice/x.yaml", RULES)
    assert (got.ok, got.reason, got.would_approve) == (False, reason, ("@bob", "carol@lab.org"))


def test_a_good_signature_lets_the_evidence_count_and_is_recorded():
    good = Signature("good", "bob@lab.org", "SHA256:abc")
    got = evaluate(policy(SIGNED), ev(MERGE, parents=2, merger=BOB, signature=good), "jobs/alice/x.yaml", RULES)
    assert got.ok and got.signer == "bob@lab.org" and got.pr == 3


def test_a_broken_approval_block_falls_back_to_trailers_only():
    parsed, errors = parse_policy("approval:\n  mode: yolo\n  required: two\n")
    assert [(m.line, m.pointer) for m in errors] == [(2, "/approval/mode"), (3, "/approval/required")]
    # the host's merge button is not trusted while the block is broken
    rules = parsed.approval
    assert (rules.mode, rules.required, rules.approvers, rules.signatures) == ("trailers", 1, None, False)
    merged = evaluate(parsed, ev("Merge pull request #7 from a/b\n\nx", parents=2), "jobs/alice/a.yaml", RULES)
    assert not merged.ok
    assert policy("approval: {approvers: ['@x']}").approval.approvers == ("@x",)
