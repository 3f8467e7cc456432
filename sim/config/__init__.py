"""The pydantic model of every scenario table, each with its own validation; `scenario` assembles them and
reads files. Like vLLM's `vllm/config/`, it imports only the layers below it (catalog, core, io), and every
layer above reads it."""
