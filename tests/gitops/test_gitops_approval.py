"""The approval rules, as pure functions (no git needed)."""

from __future__ import annotations

from ledger.gitops.approval import (
    evaluate,
    owners_for,
    parse_codeowners,
    parse_identity,
    parse_trailers,
    pull_request_number,
)
from ledger.spec.policy import ApprovalPolicy, parse_policy


def approval(text: str) -> ApprovalPolicy:
    policy, errors = parse_policy(text)
    assert errors == ()
    return policy.approval

RULES = parse_codeowners("* @admin\n/jobs/alice/ @bob carol@lab.org  # alice's reviewers\njobs/*/big.yaml @lead\n")


def test_trailers_are_the_last_paragraph_only():
    msg = "Add job\n\nApproved-by: Bob <bob@lab.org>\n\nReviewed-by: Carol <carol@lab.org>\nSigned-off-by: A <a@x>\n"
    assert parse_trailers(msg) == [("reviewed-by", "Carol <carol@lab.org>"), ("signed-off-by", "A <a@x>")]
    assert parse_trailers("Approved-by: Bob <bob@lab.org>") == []  # a subject is not a trailer block
    assert parse_trailers("x\n\nnot a trailer\nApproved-by: B <b@x>") == []


def test_codeowners_last_match_wins():
    assert owners_for(RULES, "jobs/alice/a.yaml") == ("@bob", "carol@lab.org")
    assert owners_for(RULES, "jobs/alice/big.yaml") == ("@lead",)
    assert owners_for(RULES, "README.md") == ("@admin",)


def test_identity_tokens_match_handles_names_and_emails():
    who = parse_identity("Bob <bob@lab.org>")
    assert {"@bob", "bob@lab.org"} <= who.tokens()


def test_evaluate_trailers_counts_distinct_non_author_owners():
    policy = approval("approval: {mode: trailers, required: 2}")
    msg = "x\n\nApproved-by: Bob <bob@lab.org>\nApproved-by: Bob <bob@lab.org>\nReviewed-by: Carol <carol@lab.org>"
    ok = evaluate(policy, message=msg, parents=1, authors={"alice@lab.org"}, path="jobs/alice/a.yaml", codeowners=RULES)
    assert ok.ok and ok.approvers == ("Bob <bob@lab.org>", "Carol <carol@lab.org>")
    # carol wrote it: only bob remains, and two are required
    no = evaluate(policy, message=msg, parents=1, authors={"carol@lab.org"}, path="jobs/alice/a.yaml", codeowners=RULES)
    assert not no.ok and no.would_approve == ("@bob",) and "1 more" in no.reason


def test_merge_commit_mode_needs_a_pull_request_number():
    policy = approval("approval: {mode: merge-commit}")
    gh = evaluate(policy, message="Merge pull request #7 from a/b\n\nx", parents=2, authors=set(), path="p", codeowners=[])
    assert gh.ok and gh.pr == 7
    assert pull_request_number("Add thing (#12)", 1) == 12
    assert pull_request_number("Merge branch 'x'\n\nSee merge request lab/jobs!5", 2) == 5
    assert pull_request_number("Merge pull request #7 from a/b", 1) is None  # not a merge commit
    plain = evaluate(policy, message="Approved-by: B <b@x>", parents=1, authors=set(), path="p", codeowners=[])
    assert not plain.ok


def test_a_broken_approval_block_falls_back_to_trailers_only():
    policy, errors = parse_policy("approval:\n  mode: yolo\n  required: two\n")
    assert [(m.line, m.pointer) for m in errors] == [(2, "/approval/mode"), (3, "/approval/required")]
    # the host's merge button is not trusted while the block is broken
    rules = policy.approval
    assert (rules.mode, rules.required, rules.approvers) == ("trailers", 1, None)
    merged = evaluate(rules, message="Merge pull request #7 from a/b\n\nx", parents=2, authors=set(),
                      path="jobs/alice/a.yaml", codeowners=RULES)
    assert not merged.ok
    assert approval("approval: {approvers: ['@x']}").approvers == ("@x",)
