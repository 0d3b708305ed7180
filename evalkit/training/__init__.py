"""Training the matched tiny GLA/softmax pair (`evalkit train-tiny`)."""
