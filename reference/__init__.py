"""attnconf's float64 reference: the oracle that implements spec/SPEC.md exactly."""
from .attention import Forward, attention, causal_visible, expand_kv, forward, logsumexp, oracle, visibility
from .case import DTYPES, Case, CaseError, numpy_dtype, round_to
from .emulate import baseline_error, naive_forward
from .backward import Grads, backward, backward_arrays
from .emulate_backward import naive_backward
from .layer import LayerCase, mha, naive_mha, random_layer_case
from .tiled import tiled_case, tiled_forward
from .lse import add_sink, empty_as_spec, from_base2, merge_partials, merge_states, sink_factor, to_base2

__all__ = ["Case", "CaseError", "DTYPES", "Forward", "attention", "causal_visible", "expand_kv", "forward",
           "logsumexp", "baseline_error", "naive_forward", "numpy_dtype", "oracle", "round_to", "visibility",
           "Grads", "backward", "backward_arrays", "naive_backward", "tiled_case", "tiled_forward",
           "add_sink", "empty_as_spec", "from_base2", "merge_partials", "merge_states", "sink_factor", "to_base2",
           "LayerCase", "mha", "naive_mha", "random_layer_case"]
