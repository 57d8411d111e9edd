"""The Open Inference Protocol's tensors on the wire (JSON or Triton's binary extension): pure functions over bytes.

Every problem with a request raises ``InputError`` naming the model, the field, and what to send instead.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swapless.config.describe import kind
from swapless.config.errors import InputError, SwaplessError

__all__ = [
    "HEADER_LENGTH",
    "InferRequest",
    "InputTensor",
    "OutputTensor",
    "RequestedOutput",
    "TooManyElements",
    "bytes_elements",
    "check_declared",
    "declared_elements",
    "encode_response",
    "parse_request",
]

#: The header that gives the JSON part's length in bytes when binary tensor data follows it.
HEADER_LENGTH = "Inference-Header-Content-Length"
_LENGTH = struct.Struct("<I")
_ASCII_DIGITS = re.compile(r"[0-9]{1,12}")


class _Tensor(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)


class _Input(_Tensor):
    shape: list[int]
    datatype: str = Field(min_length=1)
    data: Any = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[_Input]
    outputs: list[_Tensor] | None = None


class TooManyElements(SwaplessError):
    """An inference request declares more elements (jobs) than one request may have."""

    def __init__(self, declared: int, cap: int) -> None:
        super().__init__(declared, cap)
        self.declared, self.cap = declared, cap

    @property
    def message(self) -> str:
        return (f"the request's shapes declare {self.declared} elements, over the limit of {self.cap} per request "
                "(SWAPLESS_GATEWAY_MAX_ELEMENTS): send them in several requests")


@dataclass(frozen=True)
class InputTensor:
    """One input tensor of a request: ``raw`` holds its binary data, else ``data`` its JSON data (flattened)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: list[Any] | None = None
    raw: bytes | None = None

    @property
    def size(self) -> int:
        """How many elements the shape says the tensor has."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class RequestedOutput:
    """An output the request asks for; ``binary``: None when the request does not say."""

    name: str
    binary: bool | None
    parameters: dict[str, Any]


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: tuple[InputTensor, ...]
    outputs: tuple[RequestedOutput, ...] | None


@dataclass(frozen=True)
class OutputTensor:
    """One output of a response: BYTES ``values`` are ``str``, FP32 ones ``float``, row-major over ``shape``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: list[Any]


def _flat(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    for item in data:
        flat.extend(_flat(item))
    return flat


def _flag(value: Any, model_id: str, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise InputError(model_id, f"{where} is {kind(value)}: send true or false")


def declared_elements(raw: dict[str, Any], model_id: str) -> int:
    """How many elements a request's inputs declare, from their shapes alone.

    Raises:
        InputError: ``inputs`` is not a list, or a shape is not a short list of non-negative integers.
    """
    inputs = raw.get("inputs")
    if not isinstance(inputs, list):
        raise InputError(model_id, "field 'inputs': send a list of input tensors")
    total = 0
    for index, tensor in enumerate(inputs):
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if not isinstance(shape, list) or len(shape) > 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape
        ):
            raise InputError(model_id, f"field 'inputs.{index}.shape': give a list of at most 8 non-negative "
                             "integers, the size of each dimension")
        count = 1
        for dim in shape:
            count *= dim
        total += count
    return total


def _header(head: bytes, model_id: str, *, binary: bool) -> dict[str, Any]:
    try:
        raw = json.loads(head)
    except RecursionError:
        raise InputError(
            model_id, "the request's JSON is nested too deeply: send an inference request object"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        hint = f" (or set {HEADER_LENGTH} when binary data follows it)" if not binary else ""
        raise InputError(
            model_id, f"the request is not valid JSON ({err}): send an inference request object{hint}"
        ) from None
    if not isinstance(raw, dict):
        raise InputError(model_id, f"the request is {kind(raw)}: send a JSON object with 'inputs'")
    return raw


def _bounded(raw: dict[str, Any], model_id: str, max_elements: int) -> None:
    declared = declared_elements(raw, model_id)
    if declared > max_elements:
        raise TooManyElements(declared, max_elements)


def check_declared(head: bytes, model_id: str, max_elements: int) -> None:
    """Check the JSON part of a binary request alone: valid, and within ``max_elements``.

    Raises:
        InputError, TooManyElements: as ``parse_request``.
    """
    _bounded(_header(head, model_id, binary=True), model_id, max_elements)


def _split(body: bytes, header_length: str | None, model_id: str) -> tuple[bytes, bytes]:
    """The body's JSON part and its binary rest, by ``Inference-Header-Content-Length`` (None: all JSON)."""
    if header_length is None:
        return body, b""
    length = header_length.strip()
    if not _ASCII_DIGITS.fullmatch(length) or int(length) > len(body):
        shown = length if len(length) <= 24 else length[:24] + "..."
        raise InputError(model_id, f"{HEADER_LENGTH} is {shown!r} for a body of {len(body)} bytes: give the "
                         "length in bytes of the JSON part, in ASCII digits")
    return body[: int(length)], body[int(length) :]


def _validated(raw: dict[str, Any], model_id: str) -> _Request:
    try:
        return _Request.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InputError(
            model_id, f"field {where!r}: {first['msg']}; send an Open Inference Protocol request"
        ) from None


def _inputs(request: _Request, rest: bytes, binary: bool, model_id: str) -> list[InputTensor]:
    """The request's input tensors: JSON data, or their slices of the binary ``rest`` in order."""
    inputs = []
    offset = 0
    for tensor in request.inputs:
        where = f"input {tensor.name!r}"
        if any(dim < 0 for dim in tensor.shape):
            raise InputError(model_id, f"{where} has shape {tensor.shape}: give the size of every dimension")
        size = tensor.parameters.get("binary_data_size")
        if size is None:
            if tensor.data is None:
                raise InputError(model_id, f"{where} has no data: give 'data', or binary data and 'binary_data_size'")
            inputs.append(InputTensor(tensor.name, tensor.datatype, tuple(tensor.shape), data=_flat(tensor.data)))
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InputError(model_id, f"{where} has binary_data_size {size!r}: give its length in bytes")
        if not binary:
            raise InputError(model_id, f"{where} has binary_data_size but the request has no {HEADER_LENGTH} header: "
                             "set it to the length of the JSON part")
        if offset + size > len(rest):
            raise InputError(model_id, f"{where} says {size} bytes of binary data, but only {len(rest) - offset} "
                             "are left in the body: check binary_data_size")
        inputs.append(InputTensor(tensor.name, tensor.datatype, tuple(tensor.shape), raw=rest[offset : offset + size]))
        offset += size
    if offset != len(rest):
        raise InputError(model_id, f"the body has {len(rest) - offset} bytes after the inputs' binary data: "
                         "check each input's binary_data_size")
    return inputs


def parse_request(body: bytes, header_length: str | None, model_id: str, max_elements: int | None = None
                  ) -> InferRequest:
    """An inference request from its body and its ``Inference-Header-Content-Length`` header (None: all JSON).

    Raises:
        InputError: the body is not such a request (names the field and what to send).
        TooManyElements: the shapes declare more than ``max_elements``.
    """
    head, rest = _split(body, header_length, model_id)
    raw = _header(head, model_id, binary=header_length is not None)
    if max_elements is not None:
        _bounded(raw, model_id, max_elements)
    request = _validated(raw, model_id)
    inputs = _inputs(request, rest, header_length is not None, model_id)
    outputs = None
    if request.outputs is not None:
        outputs = tuple(
            RequestedOutput(o.name, _flag(o.parameters.get("binary_data"), model_id, f"output {o.name!r} binary_data"),
                            o.parameters)
            for o in request.outputs
        )
    return InferRequest(request.id, request.parameters, tuple(inputs), outputs)


def bytes_elements(tensor: InputTensor, model_id: str) -> list[bytes | str]:
    """The elements of a BYTES tensor: ``bytes`` from binary data, ``str`` from JSON.

    Raises:
        InputError: the data is cut short, has bytes left over, or holds a non-string JSON element.
    """
    where = f"input {tensor.name!r}"
    if tensor.raw is None:
        elements: list[bytes | str] = []
        for index, value in enumerate(tensor.data or []):
            if not isinstance(value, str):
                raise InputError(model_id, f"{where} element {index} is {kind(value)}: BYTES elements are strings")
            elements.append(value)
    else:
        elements, raw, offset = [], tensor.raw, 0
        while offset < len(raw):
            if offset + _LENGTH.size > len(raw):
                raise InputError(model_id, f"{where} ends inside a length prefix: each BYTES element is a 4-byte "
                                 "little-endian length, then that many bytes")
            (length,) = _LENGTH.unpack_from(raw, offset)
            offset += _LENGTH.size
            if offset + length > len(raw):
                raise InputError(model_id, f"{where} element {len(elements)} says {length} bytes, but only "
                                 f"{len(raw) - offset} are left: check its length prefix")
            elements.append(raw[offset : offset + length])
            offset += length
    if len(elements) != tensor.size:
        raise InputError(model_id, f"{where} has {len(elements)} elements for shape {list(tensor.shape)}: "
                         "make the shape match the data")
    return elements


def _binary(tensor: OutputTensor) -> bytes:
    if tensor.datatype == "FP32":
        return struct.pack(f"<{len(tensor.values)}f", *tensor.values)
    parts = []
    for value in tensor.values:
        encoded = value.encode("utf-8")
        parts += [_LENGTH.pack(len(encoded)), encoded]
    return b"".join(parts)


def encode_response(header: dict[str, Any], outputs: list[tuple[OutputTensor, bool]]) -> tuple[bytes, int | None]:
    """The response body (binary outputs after the JSON), and the JSON's length when some output is binary."""
    described, chunks = [], []
    for tensor, binary in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if binary:
            chunk = _binary(tensor)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = tensor.values
        described.append(entry)
    text = json.dumps({**header, "outputs": described}, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if not chunks:
        return text, None
    return b"".join([text, *chunks]), len(text)
