"""calibrate/stack_files.py: the lent stacks folder's step files are every file of step rows in it."""
from __future__ import annotations

import json

from calibrate.stack_files import HELDOUT_STEP_FILES, LENT_STACKS_DIR, OTHER_HOST_STEP_FILES, STEP_FILES, step_files
from calibrate.stack_runs import STACKS


def test_every_file_of_step_rows_in_the_folder_is_listed():
    # compile.json's rows (eager against torch.compile) are a stack no launch reveals: not runs.
    with_steps = set()
    for path in LENT_STACKS_DIR.glob("*.json"):
        rows = json.loads(path.read_text()).get("rows", [])
        if rows and all(row.get("stack") in STACKS for row in rows):
            with_steps.add(path.name)
    assert with_steps == set(STEP_FILES) | set(OTHER_HOST_STEP_FILES) | set(HELDOUT_STEP_FILES)
    assert not set(STEP_FILES) & (set(OTHER_HOST_STEP_FILES) | set(HELDOUT_STEP_FILES))
    assert [p.name for p in step_files()] == list(STEP_FILES)


def test_step_files_keeps_the_order_and_leaves_out_what_a_folder_lacks(tmp_path):
    for name in (STEP_FILES[3], STEP_FILES[0], "attention.json"):
        (tmp_path / name).write_text("{}")
    assert step_files(tmp_path) == [tmp_path / STEP_FILES[0], tmp_path / STEP_FILES[3]]
