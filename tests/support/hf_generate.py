"""transformers' own greedy decoding, the oracle for mimo's generate."""



EOS, PAD, IMG = 3, 0, 96


def hf_greedy(hf, ids, mask, steps, **inputs) -> list[list[int]]:
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, eos_token_id=EOS,
                      pad_token_id=PAD, **inputs)[:, ids.shape[1]:].tolist()
    return [row[: row.index(EOS) + 1] if EOS in row else row for row in out]
