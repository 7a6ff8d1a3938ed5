#!/usr/bin/perl
# An independent DKIM verifier for tests/outbound/test_dkim.py: Perl's Mail::DKIM (Debian
# libmail-dkim-perl), with its DNS answered from the command line (the record the test generated)
# instead of a resolver. Reads the message on stdin; prints the result ("pass", "fail", ...) and
# its detail.
use strict;
use warnings;
use Mail::DKIM::Verifier;
use Net::DNS;

my ($name, $value) = @ARGV;
die "usage: dkim_verify.pl NAME TXT-VALUE < message\n" unless defined $value;
{
    no warnings 'redefine';
    *Mail::DKIM::DNS::query = sub {
        my ($domain, $type) = @_;
        return () unless lc($domain) eq lc($name) && uc($type) eq 'TXT';
        my @strings = ($value =~ /(.{1,255})/g);
        return (Net::DNS::RR->new(name => $name, type => 'TXT', txtdata => \@strings));
    };
}
my $dkim = Mail::DKIM::Verifier->new();
binmode STDIN;
while (my $line = <STDIN>) {
    $line =~ s/\015?\012\z//;
    $dkim->PRINT("$line\015\012");
}
$dkim->CLOSE;
print $dkim->result, "\n", ($dkim->result_detail // ''), "\n";
