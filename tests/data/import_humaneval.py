#!/usr/bin/env python3
"""Turns OpenAI's HumanEval (github.com/openai/human-eval, data/HumanEval.jsonl.gz,
MIT licence) into this project's task JSONL: tests/data/humaneval.jsonl.

Each problem becomes one code task:
  prompt        the problem's prompt (signature and docstring),
  solution      prompt + canonical solution, fenced as a response would be,
  task.kind     "code",
  task.test_setup   the prompt itself: the judge runs it, so helpers the prompt
                    defines (e.g. encode_cyclic) are the task's, not the program's,
  task.entry_points the entry point: the only name the tests take from the program,
  task.assertions   one test: HumanEval's check function, called on the entry point.

Usage: python3 tests/data/import_humaneval.py HumanEval.jsonl.gz > tests/data/humaneval.jsonl
Only the data is taken; none of HumanEval's code runs here or is copied.
"""
import gzip
import json
import sys


def main(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            p = json.loads(line)
            entry = p["entry_point"]
            item = {
                "source": p["task_id"],
                "prompt": p["prompt"],
                "solution": "```python\n" + p["prompt"] + p["canonical_solution"] + "\n```\n",
                "task": {
                    "kind": "code",
                    "test_setup": p["prompt"],
                    "entry_points": [entry],
                    "assertions": [p["test"] + "\n\ncheck(" + entry + ")\n"],
                    "case_time_s": 10,
                    "total_time_s": 20,
                },
            }
            sys.stdout.write(json.dumps(item, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: import_humaneval.py HumanEval.jsonl.gz > humaneval.jsonl")
    main(sys.argv[1])
