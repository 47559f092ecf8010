"""angpt: the Approximately Normalized Transformer (anGPT), nGPT and GPT+, with tools to train, compare and ship them."""
