-- One address rule for every area: what an account may hold, the outbound queue can send to.
BEGIN;
SELECT plan(8);

SELECT ok(mailroom._is_valid_address('alice@example.com'), 'a plain address is valid');
SELECT ok(mailroom._is_valid_address('first.last+tag@mail.example.org'), 'dots and + in the local part');
SELECT ok(mailroom._is_valid_address('ops@localhost'), 'an undotted domain is a valid mailbox (local relays)');
SELECT ok(
    NOT mailroom._is_valid_address('a..b@example.com')
    AND NOT mailroom._is_valid_address('.a@example.com')
    AND NOT mailroom._is_valid_address('a.@example.com'),
    'leading, trailing or doubled dots are not a dot-atom'
);
SELECT ok(
    NOT mailroom._is_valid_address('a b@example.com')
    AND NOT mailroom._is_valid_address('a@-example.com')
    AND NOT mailroom._is_valid_address(repeat('x', 65) || '@example.com')
    AND NOT mailroom._is_valid_address(NULL),
    'spaces, bad labels, a 65-byte local part and NULL are refused'
);
SELECT ok(NOT mailroom._valid_email('ops@localhost'), 'an account email also needs a dotted domain');

-- the invariant the collector's --enqueue relies on: a valid account email is always sendable
SELECT is(
    (
        SELECT count(*)::int
        FROM unnest(ARRAY[
            'a..b@example.com', '.a@example.com', 'a.@example.com', 'a@b.c', 'x@localhost',
            'o''brien@example.ie', 'A+b@EXAMPLE.COM', 'a@b..c', 'a@b.c.', 'tab	x@example.com'
        ]) AS t (address)
        WHERE mailroom._valid_email(t.address) AND NOT mailroom._is_valid_address(t.address)
    ),
    0,
    'no address is a valid account email yet refused by the outbound queue'
);
SELECT throws_ok(
    $$SELECT mailroom.create_account('a..b@example.com', 'dots')$$,
    'MR101', 'invalid email address',
    'create_account refuses an address the queue could not send to'
);

SELECT * FROM finish();
ROLLBACK;
