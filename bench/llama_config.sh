# bench/llama_config.sh - sourced by the bench scripts: write_llama_config DIR HIDDEN LAYERS
# HEADS INTERMEDIATE writes DIR/config.json for a Llama-3-shaped model of that size (8 KV
# heads of 128, vocabulary 128256, Llama 3 RoPE scaling, bf16), to serve with
# --load-format dummy. Llama-3-8B: 4096 32 32 14336; Llama-3-70B: 8192 80 64 28672.
write_llama_config() {
    mkdir -p "$1"
    cat >"$1/config.json" <<J
{"architectures": ["LlamaForCausalLM"], "hidden_size": $2, "intermediate_size": $5,
 "num_hidden_layers": $3, "num_attention_heads": $4, "num_key_value_heads": 8, "head_dim": 128,
 "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
 "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 128000,
 "eos_token_id": 128001}
J
}
