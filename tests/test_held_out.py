"""The held-out sets stay held out (issues 50 and 56): none of their prompts or texts appears, normalised
(lower case, every run of other characters than letters and digits one space, numbers kept), in a file
under src/, tests/ or examples/, so no instruction, tool description, detector, worked example or test
was written from them; and each holds at least 60 items. A failure names the offending item only, never
the others. The sets: the assistant's everyday prompts (issue 50) and the guardrails' labelled texts
(issue 56)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ROOT / "bench" / "assistant_held_out.yaml"
DEV = ROOT / "bench" / "assistant_dev.yaml"
HELD_OUT_SETS = {HELD_OUT: "prompt", ROOT / "bench" / "guardrails_held_out.yaml": "text"}  # file: item key
SEARCHED = ("src", "tests", "examples")
SUFFIXES = (".py", ".yaml", ".yml", ".md", ".json", ".txt", ".js", ".html")


def normalised(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def prompts(path: Path, key: str = "prompt") -> list[str]:
    return [case[key] for case in yaml.safe_load(path.read_text())["cases"]]


def files(roots: list[Path]) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def leaks(asked: list[str], roots: list[Path]) -> list[tuple[str, Path]]:
    """Each prompt of `asked` found in a file under `roots`, with that file: a match of whole words of
    the normalised text ("what is 2 2" is not found in "so what is 2 25")."""
    texts = {path: f" {normalised(path.read_text(errors='replace'))} " for path in files(roots)}
    return [(prompt, path) for prompt in asked if (words := normalised(prompt))
            for path, text in texts.items() if f" {words} " in text]


@pytest.mark.parametrize("held_out", list(HELD_OUT_SETS), ids=lambda p: p.stem)
def test_no_held_out_prompt_appears_in_src_tests_or_examples(held_out: Path) -> None:
    found = leaks(prompts(held_out, HELD_OUT_SETS[held_out]), [ROOT / d for d in SEARCHED])
    assert not found, "held-out prompts written into the project (reword them there; the held-out set is " \
        "never tuned on): " + "; ".join(f"{prompt!r} in {path.relative_to(ROOT)}" for prompt, path in found)


@pytest.mark.parametrize("held_out", list(HELD_OUT_SETS), ids=lambda p: p.stem)
def test_the_held_out_set_has_at_least_60_prompts(held_out: Path) -> None:
    count = len(prompts(held_out, HELD_OUT_SETS[held_out]))
    assert count >= 60, f"{held_out.name} holds {count} items; it needs at least 60"


def test_a_planted_prompt_is_found_whatever_its_case_and_punctuation(tmp_path: Path) -> None:
    """The check itself, on a dev prompt planted in a file of each kind searched (never a held-out one)."""
    planted = prompts(DEV)[2]
    words = normalised(planted)
    assert any(c.isdigit() for c in words)  # numbers are kept
    for i, suffix in enumerate(SUFFIXES):
        (tmp_path / f"clean{i}{suffix}").write_text("nothing to see here\n")
    assert leaks([planted], [tmp_path]) == []
    for suffix in SUFFIXES:
        plant = tmp_path / f"sub/plant{suffix}"
        plant.parent.mkdir(exist_ok=True)
        plant.write_text(f'example = ["{planted.upper().replace(" ", "  ")}"]  # copied\n')
        assert leaks([planted], [tmp_path]) == [(planted, plant)]
        plant.unlink()
    (tmp_path / "near.md").write_text(f"{words}0\n")  # another number: not the prompt
    assert leaks([planted], [tmp_path]) == []


def test_the_readme_states_the_held_out_score_once_with_its_date_and_commit() -> None:
    """The README's figure for the embedded assistant is this set's, out of its real size, with the date
    and commit it was measured at; the old figure (67 % on a set that had been tuned on) is gone."""
    text = " ".join((ROOT / "README.md").read_text().split())
    claims = re.findall(r"on (\d+) everyday requests [^.]*?`bench/assistant\.py --set held-out`\) it answered "
                        r"(\d+) right \((\d+) %\) on (\d{4}-\d{2}-\d{2}), at commit ([0-9a-f]{7,40})\b", text)
    assert len(claims) == 1, claims
    total, right, percent, _, _ = claims[0]
    assert int(total) == len(prompts(HELD_OUT))
    assert int(percent) == round(100 * int(right) / int(total))
    assert "two times in three" not in text
    assert "held-out-2" not in text
