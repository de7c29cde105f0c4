"""Job specs: what a valid job is, how a bad one is refused, and the normalized form.

A job is `jobs/<owner>/<name>.yaml` in the jobs repository; its id is `<owner>/<name>`.
Everything here is pure except `files.validate_paths` and `config.load_repo_config(root)`,
which read files. See schemas/job.schema.json for the fields and jobs-repo-template/ for
examples.

The package imports nothing itself: each caller imports the module it needs (`normalize`
for validate_text, `policy`, `placement`, ...), so a reader that only needs where a job may
run (`ledger tpus`) does not load YAML, jsonschema and the policy parser (~40 ms a process).
"""
