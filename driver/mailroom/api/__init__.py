"""What the faces (http, mcp) share below them: the error shape and the edge every request passes."""
