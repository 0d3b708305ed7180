"""Golden hashes: sha256 of probes made with the shipped tiny tokenizer pin generation.

If generation changes on purpose, bump the task's version in its YAML and update these.
"""
import pytest

from evalkit.taskspec import discover

GOLDEN = {
    ("needle", 1024, 0.5, 1, 11): "d7f8af66552bc0fbd4812ddc9dd0edad73eb58b0ee7a3d7b6b5857de6efd608b",
    ("needle_uuid", 512, 0.0, 1, 12): "36d7696edd0e32a38cf251acac67d3168b7653d2560333248a889de25e6487a4",
    ("needle_phrase", 1024, 0.5, 2, 15): "954fa496043a542a453a8baee6047b40eea50b04e3b12c6ba5f14b050d5b4e2b",
    ("needle_filler", 2048, 1.0, 1, 13): "84f5dbfc56c2660155b45c38cc6d5ba06d235728a0ef9d9c9a7df150d91761ee",
    ("needle_multi", 1024, 0.25, 4, 14): "566322853e63e2d71f8550eccfce9ff9c83bd7735bd23b402b7bad0f19d09c55",
    ("multikey", 4096, 0.5, 16, 21): "1b75327e288abd2bba2d80bd0a765c79a824431eafc106f101c49991593cfd1d",
    ("multikey_mqar", 16384, 1.0, 256, 22): "f49037102cfa8b2baafcb5bea7f9d207b17bc20d2bddeffb8bb388f4ee2a409a",
    ("mqar_words", 2048, 0.5, 256, 25): "5209c6e4fe43a953b7a229e713be52a293ddda9997745765acddf703e989546a",
    ("multikey_multivalue", 4096, 0.0, 4, 23): "60bf30392d9066db98597d05196c51ff78f791f6d39b612bab7b702be20ca7b4",
    ("multikey_multiquery", 4096, 0.5, 8, 24): "663775e6337b878b813495e85359212126cd852a9da000830f49ccaf88dc49f9",
    ("conversation", 1024, 0.5, 3, 31): "19cc8a5a1d1235ea00f3401b97bd22075ddd208d1bbb9322f8f4c4e2998f6559",
    ("conversation", 4096, 1.0, 8, 32): "78d2be2ca3a4ae1c8dca52648877e291fb3545a39e4cb5c248369c94e9971100",
    ("conversation_recall", 1024, 0.5, 1, 34): "3c8b2de1ff77d5b8222de7931f859342252650c5048694813f0b7c9808c20a8f",
    ("conversation_checkpoints", 2048, 0.0, 4, 33): "8a8a545f767711d3692ded731a93fd51f37856fbeff07e9e4f6ae88454894773",
}


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_hashes(tiny_tokenizer, key):
    name, length, depth, load, seed = key
    spec = discover().get(name)
    p = spec.generator(spec.params, task=spec.name, version=spec.version,
                       tokenizer=tiny_tokenizer, length=length, depth=depth, load=load, seed=seed)
    assert p.hash == GOLDEN[key]


# mqar reads only its own word-level tokenizer (model_adapters/mqar/tokenizer)
MQAR_GOLDEN = {
    ("mqar", 64, 0.5, 4, 42): "64195e948286766bbc5fc56329c5b8739a4dd0d41d4a58af4754fcec2bb27e10",
    ("mqar", 512, 0.5, 128, 41): "100be5a5d72d73d25281b014e29e22dc52caa8a5afdc9261a9401bde2e66bf59",
}


@pytest.mark.parametrize("key", sorted(MQAR_GOLDEN))
def test_golden_hashes_mqar(key):
    from evalkit.tokenization import load_tokenizer

    from helpers import REPO

    name, length, depth, load, seed = key
    tok = load_tokenizer(REPO / "model_adapters" / "mqar" / "tokenizer")
    spec = discover().get(name)
    p = spec.generator(spec.params, task=spec.name, version=spec.version, tokenizer=tok,
                       length=length, depth=depth, load=load, seed=seed)
    assert p.hash == MQAR_GOLDEN[key]
