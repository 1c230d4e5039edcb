"""Argument checks shared by the objectives.

Hyper-parameters are Python numbers or strings, so they are checked eagerly, at trace
time, with messages that name the argument, the allowed values and the fix. Values that
arrive as traced arrays cannot be checked without a host round trip and are left alone.
"""

import numbers

import jax
import jax.numpy as jnp
import numpy as np


def check_choice(name, value, allowed):
    """Raises ValueError unless `value` is one of `allowed`."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def check_nonnegative(name, value):
    """Raises ValueError if the Python number `value` is negative."""
    if isinstance(value, numbers.Real) and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_greater(name, value, bound):
    """Raises ValueError unless the Python number `value` is > `bound`."""
    if isinstance(value, numbers.Real) and not value > bound:
        raise ValueError(f"{name} must be > {bound}, got {value}")


def check_group_size(group_size, num_rows, *, minimum=1, fn=None):
    """Raises ValueError unless `group_size` >= minimum and divides `num_rows`.

    `fn`, the public function's name, prefixes the message when given."""
    check_static_int("group_size", group_size, fn=fn)
    prefix = "" if fn is None else f"{fn}: "
    if not isinstance(group_size, numbers.Integral) or group_size < minimum:
        raise ValueError(f"{prefix}group_size must be an integer >= {minimum}, got {group_size!r}")
    if num_rows % group_size:
        raise ValueError(
            f"{prefix}group_size={group_size} does not divide the batch of {num_rows} rows; "
            "rows are P prompts x G completions laid out consecutively, so the batch "
            "must hold whole groups")


def check_unit_interval(name, value):
    """Raises ValueError unless the Python number `value` is in [0, 1]."""
    if isinstance(value, numbers.Real) and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


# --- Array checks. Shapes and dtypes are static under jit, so these run at trace time
# and cost nothing in the compiled program: they read `.shape` and `.dtype` only, never a
# value (a Python list is measured by its lengths, a Python scalar by numpy).
#
# Every message has one form: "<function>: <argument> must be <shape> for <sizes>; got
# <shape>", with B rows, T response tokens, K reward columns, V the vocabulary.

def shape_text(shape):
    """`(8, 5)` -> ``"[8, 5]"``, the notation of the docstrings."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def leaves(x):
    """The scalars of a (nested) list or tuple."""
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in leaves(item)]
    return [x]


def shape_of(x):
    """The static shape of an array, tracer, numpy array, (nested) list or Python scalar.

    A list is measured by its lengths, not converted: under jit its items may be tracers.
    """
    if hasattr(x, "shape"):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)):
        return (len(x),) + (shape_of(x[0]) if len(x) else ())
    return tuple(np.shape(x))


def _dtype(x):
    """The dtype, read without touching an array's values (numpy measures a list or a
    Python scalar on the host; a list holding arrays or tracers gets their result type)."""
    if hasattr(x, "dtype"):
        return np.dtype(x.dtype)
    scalars = leaves(x)
    if any(hasattr(leaf, "dtype") for leaf in scalars):
        return np.dtype(jnp.result_type(*scalars))
    return np.asarray(x).dtype


def shape_error(fn, name, form, shape, *, sizes=None, hint=None):
    """The ValueError of every shape check: `<fn>: <name> must be <form>[ for <sizes>]; got
    <shape>[: <hint>]`."""
    return ValueError(f"{fn}: {name} must be {form}" + ("" if sizes is None else f" for {sizes}")
                      + f"; got {shape_text(shape)}" + ("" if hint is None else f": {hint}"))


def check_static_int(name, value, *, fn=None):
    """Raises TypeError when a size that fixes a reshape arrives traced (under jit)."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            ("" if fn is None else f"{fn}: ")
            + f"{name} is a traced value ({value!r}); it fixes the shape of a reshape, "
            "so it must be a Python int: pass it as a static argument "
            f"(jax.jit(f, static_argnames={name!r})) or close over it (functools.partial)"
        )


def _is_floating(dtype):
    return jnp.issubdtype(dtype, jnp.floating)   # bfloat16 and float8 included


def check_floating(fn, **arrays):
    """Raises TypeError unless each named array has a floating dtype (None is skipped)."""
    for name, x in arrays.items():
        if x is None:
            continue
        dtype = _dtype(x)
        if not _is_floating(dtype):
            raise TypeError(f"{fn}: {name} must be a floating array; got dtype {dtype.name}: "
                            f"cast it, e.g. {name}.astype(jnp.float32)")


def check_real(fn, **arrays):
    """Raises TypeError unless each named array is bool, integer or floating (masks,
    rewards, advantages, lengths: cast inside). None is skipped."""
    for name, x in arrays.items():
        if x is None:
            continue
        dtype = _dtype(x)
        if not (dtype == np.bool_ or jnp.issubdtype(dtype, jnp.integer) or _is_floating(dtype)):
            raise TypeError(f"{fn}: {name} must be a bool, integer or floating array; "
                            f"got dtype {dtype.name}")


def check_integer(fn, **arrays):
    """Raises TypeError unless each named array has an integer dtype (token ids)."""
    for name, x in arrays.items():
        dtype = _dtype(x)
        if not jnp.issubdtype(dtype, jnp.integer):
            raise TypeError(f"{fn}: {name} must be an integer array (token ids); got dtype "
                            f"{dtype.name}: cast it, e.g. {name}.astype(jnp.int32)")


def check_like(fn, form, **arrays):
    """Raises ValueError unless every named array has the first one's shape.

    `form` names the shape in the message (``"[B, T]"``, ``"[...]"``); None values are
    skipped (optional inputs). Returns the common shape.
    """
    named = [(n, x) for n, x in arrays.items() if x is not None]
    first_name, first = named[0]
    shape = shape_of(first)
    for name, x in named[1:]:
        if shape_of(x) != shape:
            raise shape_error(fn, name, f"{form} = {shape_text(shape)} like {first_name}",
                              shape_of(x))
    return shape


def check_token_arrays(fn, **arrays):
    """Raises ValueError unless every named array is `[B, T]` with one common shape.

    The first array fixes B and T; the message names the array that differs and both
    shapes. None values are skipped (optional inputs). Returns `(B, T)`.
    """
    first_name, first = next((n, x) for n, x in arrays.items() if x is not None)
    if len(shape_of(first)) != 2:
        raise shape_error(fn, first_name, "[B, T] (rows x response tokens)", shape_of(first))
    return check_like(fn, "[B, T]", **arrays)


def check_row_values(fn, name, x, batch, *, per_token=False):
    """Raises ValueError unless `x` is `[B]` or `[B, 1]` (or `[B, T]` with `per_token`).

    `batch` is the `[B, T]` shape it must line up with.
    """
    rows, tokens = batch
    allowed = [(rows,), (rows, 1)] + ([(rows, tokens)] if per_token else [])
    if shape_of(x) not in allowed:
        forms = "[B], [B, 1] or [B, T]" if per_token else "[B] or [B, 1]"
        sizes = f"B = {rows} rows" + (f", T = {tokens} tokens" if per_token else "")
        raise shape_error(fn, name, forms, shape_of(x), sizes=sizes)


def check_rows(fn, name, x, *, ndim=(1,), rows=None, hint=None):
    """Raises ValueError unless `x` has one of the ranks `ndim` (and `rows` rows)."""
    forms = {0: "[]", 1: "[B]", 2: "[B, K]"}
    shape = shape_of(x)
    if len(shape) not in ndim or (rows is not None and shape[0] != rows):
        want = " or ".join(forms.get(n, f"rank {n}") for n in ndim)
        raise shape_error(fn, name, want, shape,
                          sizes=None if rows is None else f"B = {rows} rows", hint=hint)
    return shape


def check_scalar(fn, **arrays):
    """Raises ValueError unless each named value is a scalar (a Python number or a `[]`
    array); None is skipped."""
    for name, x in arrays.items():
        if x is not None and shape_of(x) != ():
            raise shape_error(fn, name, "[] (a scalar)", shape_of(x))


def check_scalar_or_rows(fn, name, x, rows):
    """Raises ValueError unless `x` is a scalar or `[B]` for B = `rows`."""
    if shape_of(x) not in ((), (rows,)):
        raise shape_error(fn, name, "[] (a scalar) or [B]", shape_of(x), sizes=f"B = {rows} rows")


def check_last_axis(fn, name, x, form="[..., V]", what="a vocabulary axis last"):
    """Raises ValueError unless `x` has rank >= 1 (logits: `[..., V]`)."""
    if len(shape_of(x)) < 1:
        raise shape_error(fn, name, f"{form} ({what})", shape_of(x))
    return shape_of(x)


def check_binary_mask(fn, name, mask):
    """Raises ValueError when a floating `mask` known on the host holds values other than 0
    and 1: masks select tokens (a 0.5 would count as 1), they do not weight them. A traced
    mask (under jit) cannot be read and is not checked; integer and bool masks select
    wherever they are non-zero."""
    if mask is None or isinstance(mask, (list, tuple)) or isinstance(mask, jax.core.Tracer):
        return
    if not _is_floating(_dtype(mask)) or not getattr(mask, "is_fully_addressable", True):
        return   # (an array spread over other hosts cannot be read here)
    values = np.asarray(mask)
    soft = (values != 0) & (values != 1)
    if soft.any():
        raise ValueError(f"{fn}: {name} must hold 0 and 1 only (it selects tokens; a soft "
                         f"weight would count as 1), got {values[soft].flat[0]!r}: weight "
                         "the per-token loss, or the advantages, instead")
