#!/usr/bin/env python3
"""Turns the test cases of Hugging Face's Math-Verify (github.com/huggingface/Math-Verify,
tests/*.py, MIT licence) into tests/data/math_verify_cases.jsonl.

Math-Verify's tests are pytest parametrizations of (gold, prediction, expected) with,
for some, the options they were run with. This script reads them with Python's ast
module (their code is never run or copied: only the literal case tuples are taken) and
writes one line per case:
  {"source": "test_all.py::test_latex_notation", "gold": "$1/3$", "prediction": "$\\frac13 $",
   "expected": true, "targets": ["latex"], "precision": 6, "strict": true,
   "allow_set_relation_comp": false}
`targets` are the extraction targets the test used (latex, expr); `precision` the float
rounding (decimal places). Cases whose parametrization is not a literal are counted and
skipped.

Usage: python3 tests/data/import_math_verify.py MATH_VERIFY_CHECKOUT/tests > tests/data/math_verify_cases.jsonl
"""
import ast
import json
import os
import sys

# The options each test function passes to its comparison (read from the suite's tests).
FILES = ["test_all.py", "test_boxed.py", "test_numina_cases.py", "test_open_thoughts.py", "test_strict.py",
         "test_yujianll.py"]
TARGETS = {
    "test_number_extraction": ["expr"],
    "test_latex_notation": ["latex"],
    "test_latex_notation_math": ["latex"],
    "test_relations_math": ["latex"],
    "test_matrix_extraction": ["latex"],
    "test_set_rel_assymetry": ["latex"],
}
PRECISION = {"test_float_precision": 5, "test_sqrt_precision": 5, "test_symbols": 5}


def cases(directory):
    skipped = 0
    for name in FILES:
        path = os.path.join(directory, name)
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "parametrize"):
                    continue
                fields = [f.strip() for f in ast.literal_eval(decorator.args[0]).split(",")]
                try:
                    rows = ast.literal_eval(decorator.args[1])
                except ValueError:
                    skipped += 1
                    continue
                for row in rows:
                    case = dict(zip(fields, row))
                    expected = case.get("expected", case.get("result"))
                    yield {
                        "source": name + "::" + node.name,
                        "gold": case["gold"],
                        "prediction": case["pred"],
                        "expected": bool(expected),
                        "targets": TARGETS.get(node.name, ["latex", "expr"]),
                        "precision": case.get("precision", PRECISION.get(node.name, 6)),
                        "strict": case.get("strict", True),
                        "allow_set_relation_comp": case.get("allow_set_relation_comp", False),
                    }
    if skipped:
        print("import_math_verify: %d parametrizations are not literals and were skipped" % skipped,
              file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: import_math_verify.py MATH_VERIFY_CHECKOUT/tests > math_verify_cases.jsonl")
    for case in cases(sys.argv[1]):
        sys.stdout.write(json.dumps(case, ensure_ascii=False) + "\n")
