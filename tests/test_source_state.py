"""Each cell records the code it ran from (ablations.run.provenance.source_state): the commit,
and for a checkout whose code differs from it, "-dirty" and a digest of the difference, so two
cells of one dirty commit ran the same code only if their digests are equal."""

import subprocess

from ablations.run.provenance import source_state


def git(folder, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_the_commit_and_a_digest_of_exactly_the_code_that_differs(tmp_path):
    assert source_state(tmp_path) == {"commit": "unknown"}  # not a checkout
    for name in ("attn_zoo/kernel.py", "ablations/grids/g.toml", "README.md", "reports/r.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("v1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert source_state(tmp_path) == {"commit": head}
    (tmp_path / "README.md").write_text("v2\n")  # no code: results cannot depend on it
    (tmp_path / "reports" / "new.md").write_text("a report\n")
    assert source_state(tmp_path) == {"commit": head}
    (tmp_path / "attn_zoo" / "kernel.py").write_text("v2\n")
    edited = source_state(tmp_path)
    assert edited["commit"] == f"{head}-dirty" and len(edited["diff_sha256"]) == 64
    (tmp_path / "attn_zoo" / "extra.py").write_text("x = 1\n")  # untracked code counts
    untracked = source_state(tmp_path)
    assert untracked["diff_sha256"] != edited["diff_sha256"]
    (tmp_path / "attn_zoo" / "extra.py").write_text("x = 2\n")
    assert source_state(tmp_path)["diff_sha256"] != untracked["diff_sha256"]
    (tmp_path / "attn_zoo" / "extra.py").write_text("x = 1\n")
    assert source_state(tmp_path) == untracked  # the same code, the same digest
