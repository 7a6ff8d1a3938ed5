-- The pgcrypto wrappers (sql/03_crypto.sql): the only way the schema reaches pgcrypto, whatever schema
-- pgcrypto is installed in; known vectors (RFC 4231 test case 2, SHA-256 of "abc").
BEGIN;
SELECT plan(7);
\ir fixtures/default_settings.sql

SELECT is(octet_length(mailroom_internal._random_bytes(32)), 32, '_random_bytes: as many bytes as asked');
SELECT isnt(mailroom_internal._random_bytes(16), mailroom_internal._random_bytes(16), '_random_bytes: not the same twice');
SELECT is(
    mailroom_internal._digest('abc'::bytea, 'sha256'),
    '\xba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'::bytea,
    '_digest: SHA-256("abc")'
);
SELECT is(
    mailroom_internal._hmac('what do ya want for nothing?'::bytea, 'Jefe'::bytea, 'sha256'),
    '\x5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843'::bytea,
    '_hmac: RFC 4231 test case 2'
);
SELECT is(
    mailroom_internal._hmac_many(ARRAY['what do ya want for nothing?'::bytea, 'abc'::bytea], 'Jefe'::bytea, 'sha256'),
    ARRAY[
        mailroom_internal._hmac('what do ya want for nothing?'::bytea, 'Jefe'::bytea, 'sha256'),
        mailroom_internal._hmac('abc'::bytea, 'Jefe'::bytea, 'sha256')
    ],
    '_hmac_many: one HMAC per element, in order'
);
SELECT is(
    mailroom_internal._pgp_sym_decrypt(mailroom_internal._pgp_sym_encrypt('relay secret', 'k3y', 'cipher-algo=aes256'), 'k3y'),
    'relay secret', '_pgp_sym_encrypt / _pgp_sym_decrypt round trip'
);
SELECT throws_ok(
    $$SELECT mailroom_internal._pgp_sym_decrypt(mailroom_internal._pgp_sym_encrypt('relay secret', 'k3y', 'cipher-algo=aes256'), 'other')$$,
    '39000', NULL, 'the wrong password does not decrypt'
);

SELECT * FROM finish();
ROLLBACK;
