package attack

// adminServeCases are the cases of issue 29 about nstance-admin serve: credential, Origin, Host, Content-Type (finding 2); tmux windows per shard (finding 6).
func adminServeCases() []attackCase {
	return nil
}
