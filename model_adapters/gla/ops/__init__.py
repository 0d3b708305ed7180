"""The mixers' operators, in flash-linear-attention's layout: one folder per operator,
`<op>/naive.py` (the token-by-token reference the others are tested against) and
`<op>/chunk.py` (the chunked form the model runs), the operator's signature in its __init__:
gla (plus fused_recurrent.py, for decoding), gated_delta, window_linear, window_delta.
"""
