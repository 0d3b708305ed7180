"""lm-evaluation-harness interop.

- bridge: `EvalkitLM`, evalkit models as the lm-eval model "evalkit".
- export: evalkit tasks written as an lm-eval include path (`evalkit lm-eval-export`).
- run: lm-eval's own tasks on evalkit models (`evalkit run --lm-eval-tasks`).
- cli: the `evalkit-lm-eval` command, lm-eval's command line with "evalkit" registered.
- hook: the start-up hook that makes the plain `lm-eval` command know "evalkit".
Each imports lm-eval itself; this package's import does not.
"""
