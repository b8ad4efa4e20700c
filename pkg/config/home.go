package config

// Home is the task HOME: a podman volume per task, reset every turn.
type Home struct {
	// VolumePrefix names the per-task volume: prefix + task id.
	VolumePrefix string `toml:"volume_prefix"`
}

func defaultHome() Home {
	return Home{VolumePrefix: "shrooms-home-"}
}

func (h *Home) validate() error {
	if !validVolumePrefix(h.VolumePrefix) {
		return &Error{Key: "home.volume_prefix", Msg: "must be 1-32 of a-z 0-9 _ . - and start with a letter"}
	}
	return nil
}

func validVolumePrefix(s string) bool {
	if s == "" || len(s) > 32 || !(s[0] >= 'a' && s[0] <= 'z') {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}
