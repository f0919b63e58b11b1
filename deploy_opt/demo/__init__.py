"""Built-in example models and data: the digits MLP demo and the MiniLM sentence encoder."""
