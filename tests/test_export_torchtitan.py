

def test_a_profiled_llama_exports_with_its_own_flavor_to_register() -> None:
    """The profiler's tiny Llama (hidden 64, 2 blocks, 4 heads, 2 KV heads) has no torchtitan flavor:
    the file names 'planner' and says which TransformerModelArgs to register."""
    plan = dataclasses.replace(grid_plan("tiny_llama", [0, 2, 4], dp=2, zero=3), engine="torchtitan")
    text = tt.config_text(plan)
    doc = tomllib.loads(text)
    assert doc["model"]["flavor"] == "planner"
    assert "TransformerModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2" in text
    assert doc["parallelism"]["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0"],
                                                                ["layers.1", "norm", "output"]]
