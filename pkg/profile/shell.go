package profile

// Shell is the generic dotfiles profile: a baseline of files only; no
// keep-list, no policy. Its agent is a plain shell.
func (table) Shell() Profile {
	return Profile{
		Name:             "shell",
		BootstrapTargets: []string{},
		Agent: &Agent{
			Command: []string{"/bin/sh"},
			Env:     map[string]string{},
			Home:    []string{"shell"},
		},
	}
}
