-- One address rule for every area: what an account may hold, the outbound queue can send to.
BEGIN;
SELECT plan(17);
\ir fixtures/default_settings.sql

SELECT ok(mailroom_internal._is_valid_address('alice@example.com'), 'a plain address is valid');
SELECT ok(mailroom_internal._is_valid_address('first.last+tag@mail.example.org'), 'dots and + in the local part');
SELECT ok(mailroom_internal._is_valid_address('ops@localhost'), 'an undotted domain is a valid mailbox (local relays)');
SELECT ok(
    NOT mailroom_internal._is_valid_address('a..b@example.com')
    AND NOT mailroom_internal._is_valid_address('.a@example.com')
    AND NOT mailroom_internal._is_valid_address('a.@example.com'),
    'leading, trailing or doubled dots are not a dot-atom'
);
SELECT ok(
    NOT mailroom_internal._is_valid_address('a b@example.com')
    AND NOT mailroom_internal._is_valid_address('a@-example.com')
    AND NOT mailroom_internal._is_valid_address(repeat('x', 65) || '@example.com')
    AND NOT mailroom_internal._is_valid_address(NULL),
    'spaces, bad labels, a 65-byte local part and NULL are refused'
);
SELECT ok(NOT mailroom_internal._valid_email('ops@localhost'), 'an account email also needs a dotted domain');

-- the invariant the collector's --enqueue relies on: a valid account email is always sendable
SELECT is(
    (
        SELECT count(*)::int
        FROM unnest(ARRAY[
            'a..b@example.com', '.a@example.com', 'a.@example.com', 'a@b.c', 'x@localhost',
            'o''brien@example.ie', 'A+b@EXAMPLE.COM', 'a@b..c', 'a@b.c.', 'tab	x@example.com'
        ]) AS t (address)
        WHERE mailroom_internal._valid_email(t.address) AND NOT mailroom_internal._is_valid_address(t.address)
    ),
    0,
    'no address is a valid account email yet refused by the outbound queue'
);
SELECT throws_ok(
    $$SELECT mailroom.create_account('a..b@example.com', 'dots')$$,
    'MR101', 'invalid email address',
    'create_account refuses an address the queue could not send to'
);

SELECT is(
    ARRAY(
        SELECT t.d FROM unnest(ARRAY['example.com', 'a', 'mx-1.example.co.uk', 'x' || repeat('.abcdefghi', 25)]) AS t (d)
        WHERE mailroom_internal._is_domain_name(t.d)
    ),
    ARRAY['example.com', 'a', 'mx-1.example.co.uk', 'x' || repeat('.abcdefghi', 25)],
    'domain names: LDH labels, up to 251 octets here'
);
SELECT is(
    ARRAY(
        SELECT t.d FROM unnest(ARRAY[
            '', '-a.com', 'a-.com', 'a..com', 'a.com.', 'Example.com', 'a_b.com', '*.a.com', repeat('a', 64) || '.com',
            'x' || repeat('.abcdefghi', 26)
        ]) AS t (d)
        WHERE mailroom_internal._is_domain_name(t.d)
    ),
    '{}'::text[],
    'not domain names: empty, edge hyphens, empty labels, upper case, underscore, wildcard, a 64-octet label, 261 octets'
);
SELECT is(mailroom_internal._is_domain_name(NULL), false, 'NULL is not a domain name');

-- plus-addressing: the box and the tag of an address in stored form
SELECT is(mailroom_internal._address_base('box+news@example.org'), 'box@example.org', 'box+tag@: the box');
SELECT is(mailroom_internal._address_base('box@example.org'), 'box@example.org', 'no tag: the address itself');
SELECT is(mailroom_internal._address_base('+x@example.org'), '+x@example.org', 'a local part starting with + is not split');
SELECT is(mailroom_internal._address_tag('box+news.2024_a-b@example.org'), 'news.2024_a-b', 'the tag');
SELECT is(mailroom_internal._address_tag('box+a+b@example.org'), NULL, 'what follows the + is no tag: NULL');
SELECT is(mailroom_internal._address_tag('box@exa+mple.org'), NULL, 'a + in the domain is no tag');

SELECT * FROM finish();
ROLLBACK;
