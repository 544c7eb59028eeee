use super::*;
use serde_json::json;

fn base() -> Value {
    json!({
        "model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "architectures": ["LlamaForCausalLM"]
    })
}

fn with(key: &str, value: Value) -> Value {
    let mut v = base();
    v.as_object_mut().unwrap().insert(key.to_string(), value);
    v
}

/// SmolLM2-135M's config.json as published (its descriptive fields included) reads.
#[test]
fn smollm2_s_published_config_reads() {
    let published = json!({
        "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0,
        "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536, "is_llama_config": true, "max_position_embeddings": 8192, "mlp_bias": false,
        "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null,
        "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
        "use_cache": true, "vocab_size": 49152
    });
    let c = LlamaConfig::from_json(&published).unwrap();
    assert_eq!((c.head_dim, c.kv_heads, c.layers, c.rope_theta), (64, 3, 30, 100000.0));
    assert!(c.tie_word_embeddings);
}

#[test]
fn a_llama_config_reads_its_shape_and_defaults() {
    let c = LlamaConfig::from_json(&base()).unwrap();
    assert_eq!((c.family, c.head_dim, c.kv_heads, c.layers), (Family::Llama, 8, 2, 2));
    assert!(!c.qkv_bias && !c.o_bias && !c.qk_norm && !c.tie_word_embeddings);
    assert_eq!((c.rope_theta, c.rope_scaling.clone(), c.sliding_window), (10000.0, None, None));
    let q2 = LlamaConfig::from_json(&with("model_type", json!("qwen2"))).unwrap();
    assert!(q2.qkv_bias && !q2.o_bias);
    let q3 = LlamaConfig::from_json(&with("model_type", json!("qwen3"))).unwrap();
    assert!(q3.qk_norm && !q3.qkv_bias);
    let m = LlamaConfig::from_json(&with("model_type", json!("mistral"))).unwrap();
    assert_eq!(m.sliding_window, None);
}

/// What lethe does not implement is refused, by name: an unknown field, another
/// architecture, another RoPE scaling, an activation, a sliding window on Qwen, shapes
/// that do not divide.
#[test]
fn what_lethe_does_not_implement_is_refused_by_name() {
    let cases = [
        (with("rope_type_extra", json!(1)), "`rope_type_extra`"),
        (with("model_type", json!("gemma")), "model_type `gemma`"),
        (with("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0})), "`yarn`"),
        (with("rope_scaling", json!({"type": "linear", "factor": 4.0})), "`linear`"),
        (with("hidden_act", json!("gelu")), "hidden_act `gelu`"),
        (with("num_key_value_heads", json!(3)), "num_key_value_heads = 3"),
        (with("attention_dropout", json!(0.1)), "attention_dropout"),
        (with("pretraining_tp", json!(2)), "pretraining_tp"),
        (with("layer_types", json!(["full_attention", "sliding_attention"])), "sliding_attention"),
        (with("vocab_size", json!(0)), "`vocab_size`"),
        (with("rope_interleaved", json!(true)), "rope_interleaved"),
        (with("quantization_config", json!({"quant_method": "gptq"})), "`quantization_config`"),
    ];
    for (config, needle) in cases {
        let err = LlamaConfig::from_json(&config).expect_err(needle);
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let mut qwen = with("model_type", json!("qwen2"));
    qwen.as_object_mut().unwrap().insert("use_sliding_window".into(), json!(true));
    assert!(LlamaConfig::from_json(&qwen).unwrap_err().contains("use_sliding_window"));
}

/// Numbers the arithmetic cannot use are refused by name rather than read into NaN
/// logits: a rotary base, an RMSNorm epsilon or a llama3 scaling out of range.
#[test]
fn numbers_out_of_range_are_refused_by_name() {
    let llama3 = |low: f64, high: f64, factor: f64| {
        json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
               "original_max_position_embeddings": 32})
    };
    let cases = [
        (with("rope_theta", json!(-5.0)), "`rope_theta` = -5 must be a finite number above 1"),
        (with("rope_theta", json!(0.5)), "`rope_theta` = 0.5"),
        (with("rms_norm_eps", json!(-1.0)), "`rms_norm_eps` = -1 must be a finite number in (0, 1)"),
        (with("rms_norm_eps", json!(0.0)), "`rms_norm_eps` = 0"),
        (with("rope_parameters", json!({"rope_type": "default", "rope_theta": -1.0})), "`rope_theta` = -1"),
        (with("rope_scaling", llama3(1.0, 4.0, -8.0)), "`rope_scaling: factor` = -8"),
        (with("rope_scaling", llama3(0.0, 4.0, 8.0)), "`rope_scaling: low_freq_factor` = 0"),
        (with("rope_scaling", llama3(4.0, 4.0, 8.0)), "high_freq_factor = 4 must be above low_freq_factor = 4"),
    ];
    for (config, needle) in cases {
        let err = LlamaConfig::from_json(&config).expect_err(needle);
        assert!(err.contains(needle), "{needle}: {err}");
    }
    assert!(LlamaConfig::from_json(&with("rms_norm_eps", json!(1e-6))).is_ok());
}

/// Llama 3's scaling by hand: high frequencies kept, low ones divided by the factor, the
/// ones between smoothed (theta 100 and a context of 32 put one of head_dim 8's four
/// frequencies in each of the first two regimes and two in the third); the default ones
/// `theta^(-2i/d)`.
#[test]
fn llama3_scaling_keeps_high_divides_low_and_smooths_between() {
    let scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32});
    let mut config = with("rope_scaling", scaling);
    config.as_object_mut().unwrap().insert("rope_theta".into(), json!(100.0));
    let c = LlamaConfig::from_json(&config).unwrap();
    let plain = Vec::<f32>::try_from(inverse_frequencies(&LlamaConfig { rope_scaling: None, ..c.clone() })).unwrap();
    let scaled = Vec::<f32>::try_from(inverse_frequencies(&c)).unwrap();
    let mut regimes = [0; 3];
    for (i, &f) in plain.iter().enumerate() {
        let by_hand = 100f64.powf(-((2 * i) as f64) / 8.0);
        assert!((f as f64 - by_hand).abs() < 1e-6 * by_hand, "{i}: {f} against {by_hand}");
        let wavelen = 2.0 * std::f64::consts::PI / by_hand;
        let (regime, want) = if wavelen < 8.0 {
            (0, by_hand)
        } else if wavelen > 32.0 {
            (2, by_hand / 8.0)
        } else {
            let s = (32.0 / wavelen - 1.0) / (4.0 - 1.0);
            (1, (1.0 - s) * by_hand / 8.0 + s * by_hand)
        };
        regimes[regime] += 1;
        assert!((scaled[i] as f64 - want).abs() < 1e-6 * want, "{i}: {} against {want}", scaled[i]);
    }
    assert_eq!(regimes, [1, 1, 2]);
}
