"""Request bodies that routes read themselves, declared once as field tables.

FastAPI describes a body that a route takes as a pydantic model (/v1/audio/speech); the bodies a
route parses itself (the multipart transcription form, KServe v2 infer, Triton's repository
index) are declared here as a `Body`: each field's name, JSON type, default, limits and meaning.
The route's parser reads its fields through the `Body` (a name it does not declare is a
KeyError) and takes its limits from it, and speechrt.serving.openapi writes the schema of
/openapi.json from the same `Body`, so a field the route takes is a field the document shows.
The tables themselves sit beside their parsers (openai_api, v2codec, kserve).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from starlette.datastructures import FormData, UploadFile

# JSON Schema as plain data (the OpenAPI document is JSON)
Json = str | int | float | bool | None | list["Json"] | dict[str, "Json"]
Schema = dict[str, Json]
Kind = Literal["string", "integer", "number", "boolean", "array", "object", "file"]


@dataclass(frozen=True)
class Field:
    """One field of a body. `items` is an array's element: a JSON type or a nested body;
    `body` an object field's own declared body; `aliases` other names the route reads the same
    field by; `example` a value the route accepts (tests send it)."""

    name: str
    kind: Kind
    description: str = ""
    required: bool = False
    default: Json = None
    choices: tuple[str, ...] = ()  # the accepted strings (of each item, for an array)
    items: Kind | Body | None = None
    body: Body | None = None
    min_items: int | None = None
    max_items: int | None = None
    minimum: int | None = None  # integers, and an array's integer items
    nullable: bool = False  # null reads as absent
    aliases: tuple[str, ...] = ()
    example: Json = None

    def schema(self) -> Schema:
        out: Schema
        if self.body is not None:
            out = ref(self.body)
        elif self.kind == "file":
            out = {"type": "string", "format": "binary"}
        else:
            out = {"type": self.kind}
        if self.kind == "array":  # (items not given: any JSON)
            item: Schema = (
                ref(self.items)
                if isinstance(self.items, Body)
                else ({"type": self.items} if self.items else {})
            )
            if self.choices:
                item["enum"] = list(self.choices)
            if self.minimum is not None:
                item["minimum"] = self.minimum
            out["items"] = item
            if self.min_items is not None:
                out["minItems"] = self.min_items
            if self.max_items is not None:
                out["maxItems"] = self.max_items
        else:
            if self.choices:
                out["enum"] = list(self.choices)
            if self.minimum is not None:
                out["minimum"] = self.minimum
        if self.nullable:
            out = {"anyOf": [out, {"type": "null"}]}
        if self.default is not None:
            out["default"] = self.default
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Body:
    """A body's fields (the routes ignore keys they do not declare)."""

    name: str  # its schema's name under components/schemas
    description: str
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field:
        """The field called `name` (or aliased so); a KeyError for a name not declared."""
        for f in self.fields:
            if name == f.name or name in f.aliases:
                return f
        raise KeyError(f"{self.name} declares no field {name!r}")

    def get(self, obj: dict[str, Json], name: str) -> Json:
        """A JSON body's value of declared field `name`: its default if absent ({} for an
        object field)."""
        f = self.field(name)
        default: Json = {} if f.kind == "object" and f.default is None else f.default
        return obj.get(name, default)

    def names(self) -> list[str]:
        """Every name a client may send, aliases included."""
        return [n for f in self.fields for n in (f.name, *f.aliases)]

    def schema(self) -> Schema:
        properties: dict[str, Json] = {}
        for f in self.fields:
            properties[f.name] = f.schema()
            for alias in f.aliases:
                properties[alias] = {**f.schema(), "description": f"the same as {f.name}"}
        out: Schema = {"type": "object", "title": self.name, "properties": properties}
        required: list[Json] = [f.name for f in self.fields if f.required]
        if required:
            out["required"] = required
        if self.description:
            out["description"] = self.description
        return out

    def components(self) -> dict[str, Schema]:
        """This body's schema and its nested bodies', by name."""
        out = {self.name: self.schema()}
        for f in self.fields:
            for nested in (f.body, f.items):
                if isinstance(nested, Body):
                    out |= nested.components()
        return out


def ref(body: Body) -> Schema:
    return {"$ref": f"#/components/schemas/{body.name}"}


class FormReader:
    """A multipart form's fields, read only as its `Body` declares them."""

    def __init__(self, form: FormData, body: Body) -> None:
        self.form, self.body = form, body

    def value(self, name: str) -> str | UploadFile | None:
        """The field's value, or its declared default (a string) where it is absent."""
        default = self.body.field(name).default
        return self.form.get(name, None if default is None else str(default))

    def values(self, name: str) -> list[str | UploadFile]:
        """Every value of a repeated field, under its name and then each alias."""
        f = self.body.field(name)
        return [v for n in (f.name, *f.aliases) for v in self.form.getlist(n)]


def request_body(
    body: Body, media: str, required: bool = True, raw: str | None = None
) -> dict[str, Json]:
    """A route's `openapi_extra` (FastAPI merges it into the route's operation): its request
    body is `body`, sent as `media`, or bytes sent as `raw` (a media type; its route says what
    the bytes are). openapi.py adds `body`'s schemas to the components."""
    content: dict[str, Json] = {media: {"schema": ref(body)}}
    if raw is not None:
        content[raw] = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": required, "content": content}}
