"""The outbound queue: the sender, its SMTP relay client, metrics and the operator commands."""
