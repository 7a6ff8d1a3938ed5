"""Running it all: the supervisor (`mailroom run`), the end-to-end demo and the doctor."""
