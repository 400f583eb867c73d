"""A user's plugin: a small transformers encoder built from a config (random init, no
files), whose forward returns the library's own `ModelOutput`."""

import numpy as np

import zoo


def build():
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, type_vocab_size=2)
    return BertModel(config, add_pooling_layer=True).eval()


def sample(batch, rng):
    mask = np.ones((batch, 10), np.int64)
    mask[:, 7:] = 0
    return {"input_ids": rng.integers(0, 64, (batch, 10)), "token_type_ids": rng.integers(0, 2, (batch, 10)),
            "attention_mask": mask}


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="bert-tiny.modeloutput", domain="nlp", task="feature-extraction",
        # the spec's order is not the forward's (input_ids, attention_mask, token_type_ids)
        inputs=(zoo.TensorSpec("input_ids", "int64", ("batch", "seq"), value_range=(0, 63)),
                zoo.TensorSpec("token_type_ids", "int64", ("batch", "seq"), value_range=(0, 1)),
                zoo.TensorSpec("attention_mask", "int64", ("batch", "seq"), value_range=(0, 1))),
        outputs=(zoo.TensorSpec("last_hidden_state", "float32", ("batch", "seq", 32)),
                 zoo.TensorSpec("pooler_output", "float32", ("batch", 32))),
        build=build, sample=sample,
        axes={"batch": zoo.AxisRange(1, 4, 16), "seq": zoo.AxisRange(2, 10, 32)}))
