"""Functions that are not FlexAttention mask_mods, for `furnace cp`'s bad-input cases."""


def two_indices(q_idx, kv_idx):
    return q_idx >= kv_idx


def not_boolean(b, h, q_idx, kv_idx):
    return q_idx - kv_idx


def raises(b, h, q_idx, kv_idx):
    raise RuntimeError("this mask cannot be evaluated")


def good_causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx
