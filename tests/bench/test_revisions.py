"""bench/revisions.py's worktree preparation, on a small git repository made here: an unknown
revision and a worktree with local changes, at another commit, or a folder that is no worktree
are refused with a message that names them; a clean one is made once and reused. No timings."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_revisions():
    spec = importlib.util.spec_from_file_location("bench_revisions", REPO / "bench" / "revisions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


revisions = load_revisions()


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository with two commits (a.txt written twice)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "bench@example.invalid")
    git(root, "config", "user.name", "bench")
    for text in ("one\n", "two\n"):
        (root / "a.txt").write_text(text)
        git(root, "add", "a.txt")
        git(root, "commit", "-q", "-m", text.strip())
    return root


def test_unknown_revision_is_refused_by_name(repo):
    with pytest.raises(revisions.RevisionError, match=r"unknown revision 'no-such-rev'"):
        revisions.resolve("no-such-rev", repo)
    first = git(repo, "rev-parse", "HEAD~1")
    assert revisions.resolve(first[:7], repo) == first


def test_clean_worktree_is_made_once_then_reused(repo, tmp_path):
    commit = revisions.resolve("HEAD~1", repo)
    root = tmp_path / "trees"
    path = revisions.checkout(commit, root, repo)
    assert path == root / f"candle-web-rev-{commit[:12]}"
    assert (path / "a.txt").read_text() == "one\n"  # that commit's file, not the newest
    (path / "untracked.log").write_text("a build output")  # not a change of the revision
    assert revisions.checkout(commit, root, repo) == path
    assert len(git(repo, "worktree", "list").splitlines()) == 2


def test_dirty_worktree_is_refused_naming_the_file(repo, tmp_path):
    commit = revisions.resolve("HEAD", repo)
    path = revisions.checkout(commit, tmp_path / "trees", repo)
    (path / "a.txt").write_text("edited\n")
    with pytest.raises(revisions.RevisionError, match=r"is dirty \(changed: a\.txt\)"):
        revisions.checkout(commit, tmp_path / "trees", repo)


def test_worktree_moved_to_another_commit_is_refused(repo, tmp_path):
    commit = revisions.resolve("HEAD", repo)
    path = revisions.checkout(commit, tmp_path / "trees", repo)
    git(path, "checkout", "-q", "--detach", "HEAD~1")
    with pytest.raises(revisions.RevisionError, match=rf"is at \w{{12}}, not {commit[:12]}"):
        revisions.checkout(commit, tmp_path / "trees", repo)


def test_folder_that_is_no_worktree_is_refused(repo, tmp_path):
    commit = revisions.resolve("HEAD", repo)
    (tmp_path / "trees" / f"candle-web-rev-{commit[:12]}").mkdir(parents=True)
    with pytest.raises(revisions.RevisionError, match="exists but is not a worktree"):
        revisions.checkout(commit, tmp_path / "trees", repo)
