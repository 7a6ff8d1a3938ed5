-- mailroom_timekeeper calls pin_clock / unpin_clock, so it reaches the schema like the other
-- runtime roles (USAGE only: nothing in it is granted to the role but those two functions).

GRANT USAGE ON SCHEMA mailroom TO mailroom_timekeeper;
