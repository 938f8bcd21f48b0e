#!/usr/bin/perl
# api_names.pl — the names of the functions declared CKPT_API in the given headers,
# one a line, sorted. Comments and preprocessor lines are removed first, so that the
# definition of CKPT_API itself and prose that mentions it are not counted; a
# declaration may span lines. The name is the identifier right before the first '('
# that follows CKPT_API.
use strict;
use warnings;

my %names;
for my $file (@ARGV) {
	open(my $fh, '<', $file) or die "api_names.pl: $file: $!\n";
	local $/;
	my $text = <$fh>;
	close $fh;
	$text =~ s{/\*.*?\*/}{ }gs;        # block comments
	$text =~ s{//[^\n]*}{}g;           # line comments
	$text =~ s{^[ \t]*#(?:[^\n]*\\\n)*[^\n]*}{}gm;  # preprocessor lines, continued ones too
	while ($text =~ /\bCKPT_API\b([^;{]*?)\(/gs) {
		my $decl = $1;
		if ($decl =~ /([A-Za-z_][A-Za-z0-9_]*)\s*$/) {
			$names{$1} = 1;
		} else {
			die "api_names.pl: $file: cannot find the name in 'CKPT_API$decl('\n";
		}
	}
}
print "$_\n" for sort keys %names;
