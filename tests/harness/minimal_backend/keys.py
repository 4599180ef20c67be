"""The keys of backend=minimal: each declared once, with its kind, meaning and default (a plugin
has no YAML of its own: rayflow composes these defaults as its option `backend/minimal`)."""

from pydantic import Field

from rayflow.schema.kinds import Text
from rayflow.schema.root import Section


class Minimal(Section):
    name: Text = Field(description="`minimal`: a running Ray cluster, joined, never stopped")
    address: Text = Field(
        None, description="`HOST:PORT` of the running cluster's GCS (null: it must be given)"
    )
