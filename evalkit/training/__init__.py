"""What evalkit trains, on this machine's CPUs, each resumable with a card per model:

- `evalkit train-tiny` (train.py, data.py, save.py, cards.py): the matched tiny GLA/softmax pair
  and recall-mamba2-tiny, on needles the task plugins make;
- `evalkit train-mqar` (mqar.py, mqar_family.py, mqar_card.py): the MQAR mixer twins;
- `evalkit linearize` (linearize.py, linearize_e2e.py, linearize_family.py, linearize_card.py,
  prose.py): a transformer's linearized twins (attention transfer, then end to end);
- output.py: where each command writes (one owned folder per model, swapped in whole).
"""
