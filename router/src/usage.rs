//! What the decode's answer says about the prompt, set from the prefill's (as vllm-router does):
//! the prompt's token count and its details from the prefill, the total recomputed, cached tokens =
//! the prefill's prefix-cache hits (absent if the prefill reported none). Non-streamed answers also
//! get the prefill's prompt logprobs. The names are the route's (routes.rs): chat and completions
//! say prompt_tokens, the Responses API input_tokens, and a Responses stream carries its usage in
//! the final event's `response`.

use crate::routes::UsageNames;
use serde_json::{Map, Value};

fn usage(v: &Value) -> Option<&Map<String, Value>> {
    v.get("usage").or_else(|| v.get("response").and_then(|r| r.get("usage"))).and_then(Value::as_object)
}

fn usage_mut(v: &mut Value) -> Option<&mut Map<String, Value>> {
    if v.get("usage").is_some_and(Value::is_object) {
        return v.get_mut("usage").and_then(Value::as_object_mut);
    }
    v.get_mut("response").and_then(|r| r.get_mut("usage")).and_then(Value::as_object_mut)
}

/// Rewrite `target`'s usage from `prefill`'s; true if anything changed.
pub fn reconcile(prefill: &Value, target: &mut Value, names: &UsageNames) -> bool {
    let Some(source) = usage(prefill) else {
        return false;
    };
    let Some(out) = usage_mut(target) else {
        return false;
    };
    let before = out.clone();
    if let Some(input) = source.get(names.input).and_then(Value::as_u64) {
        out.insert(names.input.into(), input.into());
        match out.get(names.output).and_then(Value::as_u64).and_then(|c| c.checked_add(input)) {
            Some(total) => {
                out.insert("total_tokens".into(), total.into());
            }
            None => {
                out.remove("total_tokens");
            }
        }
    }
    let details = source.get(names.input_details).and_then(Value::as_object);
    let cached = details
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64)
        .filter(|c| source.get(names.input).and_then(Value::as_u64).is_none_or(|p| *c <= p));
    let extra: Vec<(&String, &Value)> =
        details.map(|d| d.iter().filter(|(k, _)| *k != "cached_tokens").collect()).unwrap_or_default();
    if (cached.is_some() || !extra.is_empty()) && !out.get(names.input_details).is_some_and(Value::is_object) {
        out.insert(names.input_details.into(), Value::Object(Map::new()));
    }
    if let Some(d) = out.get_mut(names.input_details).and_then(Value::as_object_mut) {
        for (k, v) in extra {
            d.insert(k.clone(), v.clone());
        }
        match cached {
            Some(c) => {
                d.insert("cached_tokens".into(), c.into());
            }
            None => {
                d.remove("cached_tokens");
            }
        }
    }
    *out != before
}

/// Prompt logprobs computed by the prefill, carried into the decode's non-streamed answer: the
/// top-level and per-choice `prompt_logprobs`, and for completions with `echo` the prompt part of
/// each choice's logprobs arrays (tokens, token_logprobs, top_logprobs, text_offset shifted).
pub fn merge_logprobs(prefill: &Value, target: &mut Value) {
    if let Some(p) = prefill.get("prompt_logprobs").filter(|v| !v.is_null()) {
        if let Some(obj) = target.as_object_mut() {
            obj.insert("prompt_logprobs".into(), p.clone());
        }
    }
    let Some(pchoices) = prefill.get("choices").and_then(Value::as_array) else {
        return;
    };
    let Some(dchoices) = target.get_mut("choices").and_then(Value::as_array_mut) else {
        return;
    };
    for (d, p) in dchoices.iter_mut().zip(pchoices) {
        let (Some(d), Some(p)) = (d.as_object_mut(), p.as_object()) else {
            continue;
        };
        let prompt_logprobs = p.get("prompt_logprobs").filter(|v| !v.is_null());
        let n = prompt_logprobs.and_then(Value::as_array).map_or(0, Vec::len);
        if let Some(pl) = prompt_logprobs {
            d.insert("prompt_logprobs".into(), pl.clone());
        }
        if n == 0 {
            continue;
        }
        let (Some(plog), Some(dlog)) =
            (p.get("logprobs").and_then(Value::as_object), d.get_mut("logprobs").and_then(Value::as_object_mut))
        else {
            continue;
        };
        let shift =
            match (plog.get("text_offset").and_then(Value::as_array), plog.get("tokens").and_then(Value::as_array)) {
                (Some(off), Some(tok)) if off.len() >= n && tok.len() >= n => {
                    let last = off.get(n - 1).and_then(Value::as_i64).unwrap_or(0);
                    last + tok.get(n - 1).and_then(Value::as_str).map_or(0, |s| s.len() as i64)
                }
                _ => 0,
            };
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let Some(prompt_part) = plog.get(key).and_then(Value::as_array) else {
                continue;
            };
            let Some(own) = dlog.get(key).and_then(Value::as_array) else {
                continue;
            };
            let mut merged: Vec<Value> = prompt_part.iter().take(n).cloned().collect();
            if key == "text_offset" {
                merged.extend(own.iter().filter_map(Value::as_i64).map(|o| Value::from(o + shift)));
            } else {
                merged.extend(own.iter().cloned());
            }
            dlog.insert(key.into(), Value::Array(merged));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::ROUTES;
    use serde_json::json;

    #[test]
    fn usage_takes_the_prompt_side_from_the_prefill() {
        let prefill = json!({"usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101,
                             "prompt_tokens_details": {"cached_tokens": 64}}});
        let mut decode = json!({"usage": {"prompt_tokens": 100, "completion_tokens": 8, "total_tokens": 108,
                                "prompt_tokens_details": {"cached_tokens": 99}}});
        assert!(reconcile(&prefill, &mut decode, &ROUTES[0].usage));
        assert_eq!(
            decode["usage"],
            json!({"prompt_tokens": 100, "completion_tokens": 8, "total_tokens": 108,
                                           "prompt_tokens_details": {"cached_tokens": 64}})
        );
        let mut decode = json!({"usage": {"prompt_tokens": 100, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 99}}});
        reconcile(&json!({"usage": {"prompt_tokens": 100}}), &mut decode, &ROUTES[0].usage);
        assert_eq!(decode["usage"]["prompt_tokens_details"], json!({}));
        let mut none = json!({"choices": []});
        assert!(!reconcile(&prefill, &mut none, &ROUTES[0].usage));
    }

    #[test]
    fn responses_usage_is_named_input_and_output_and_nested_in_a_streams_last_event() {
        let responses = &ROUTES[2].usage;
        let prefill = json!({"usage": {"input_tokens": 100, "output_tokens": 1, "total_tokens": 101,
                             "input_tokens_details": {"cached_tokens": 64}}});
        let mut event = json!({"type": "response.completed", "response": {"usage": {
            "input_tokens": 100, "output_tokens": 8, "total_tokens": 108, "input_tokens_details": {"cached_tokens": 0}}}});
        assert!(reconcile(&prefill, &mut event, responses));
        assert_eq!(event["response"]["usage"]["input_tokens_details"], json!({"cached_tokens": 64}));
        assert_eq!(event["response"]["usage"]["total_tokens"], json!(108));
    }

    #[test]
    fn prompt_logprobs_come_from_the_prefill() {
        let prefill = json!({"choices": [{"prompt_logprobs": [null, {"1": -0.5}],
            "logprobs": {"tokens": ["a", "b", "c"], "token_logprobs": [null, -0.5, -1.0], "text_offset": [0, 1, 2]}}]});
        let mut decode = json!({"choices": [{"logprobs": {"tokens": ["x", "y"], "token_logprobs": [-0.1, -0.2], "text_offset": [0, 1]}}]});
        merge_logprobs(&prefill, &mut decode);
        let c = &decode["choices"][0];
        assert_eq!(c["prompt_logprobs"], json!([null, {"1": -0.5}]));
        assert_eq!(c["logprobs"]["tokens"], json!(["a", "b", "x", "y"]));
        assert_eq!(c["logprobs"]["token_logprobs"], json!([null, -0.5, -0.1, -0.2]));
        assert_eq!(c["logprobs"]["text_offset"], json!([0, 1, 2, 3]));
    }
}
