package agents_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// gmCommand is the custom command the corpus plants in ~/.gemini/commands:
// it runs only when a prompt invokes it, so every turn 2 of the corpus
// (control and shrooms) starts its prompt with it, as an owner who had
// such a command would.
const gmCommand = "/cwcmd"

// geminiVectors are Gemini CLI's own persistence vectors (HOME and
// worktree), for the pinned Gemini CLI 0.61.0 (read from its bundle:
// settings layers, extensions, commands, skills, subagents, GEMINI.md
// and its @imports, the .env search).
func geminiVectors(nonce string) []corpusVector {
	// settings merges a JSON object into a settings file (the baseline's
	// model name stays).
	settings := func(path, obj string) string {
		return `mkdir -p $(dirname ` + path + `) && python3 -c 'import json,os,sys; p=os.path.expanduser(sys.argv[1]); d=json.load(open(p)) if os.path.exists(p) else {}; d.update(json.loads(sys.argv[2])); json.dump(d,open(p+".tmp","w")); os.rename(p+".tmp",p)' ` + path + ` '` + obj + `'`
	}
	hook := func(marker string) string {
		return `[{"hooks":[{"type":"command","command":"` + touch(marker) + `"}]}]`
	}
	mcp := func(name, marker string) string {
		return `"` + name + `":{"command":"sh","args":["-c","` + touch(marker) + `; sleep 2"]}`
	}
	userSettings := `{"hooksConfig":{"enabled":true},"hooks":{"SessionStart":` + hook("gm-user-sessionstart") + `,"BeforeAgent":` + hook("gm-user-beforeagent") + `},` +
		`"mcpServers":{` + mcp("cwmcp", "gm-user-mcp") + `},"tools":{"discoveryCommand":"sh -c \"` + touch("gm-user-discovery") + `; echo []\""}}`
	projectSettings := `{"hooksConfig":{"enabled":true},"hooks":{"SessionStart":` + hook("gm-proj-sessionstart") + `},"mcpServers":{` + mcp("cwpmcp", "gm-proj-mcp") + `}}`
	skill := func(dir, id string) string {
		return `mkdir -p ` + dir + `/cw` + id + ` && printf -- '---\nname: cw` + id + `\ndescription: %s\n---\nUse it.\n' "` + codeWord(id, nonce) + `" > ` + dir + `/cw` + id + `/SKILL.md`
	}
	agentFile := func(dir, id string) string {
		return `mkdir -p ` + dir + ` && printf -- '---\nname: cw` + id + `\ndescription: %s\nkind: local\n---\nYou help.\n' "` + codeWord(id, nonce) + `" > ` + dir + `/cw` + id + `.md`
	}
	// systemMD points GEMINI_SYSTEM_MD, from the .env file envFile, at a
	// system prompt carrying id's code word (and the skills and subagents
	// the default prompt would list, so the other vectors still show).
	systemMD := func(envFile, mdFile, id string) string {
		return `mkdir -p $(dirname ` + envFile + `) && printf '%s\n%s\n%s\n' "` + codeWord(id, nonce) + `" '${AgentSkills}' '${SubAgents}' > ` + mdFile + ` && echo "GEMINI_SYSTEM_MD=` + mdFile + `" > ` + envFile
	}
	ext := "~/.gemini/extensions/cwext"
	return []corpusVector{
		{id: "gm-user-sessionstart", where: "home", plant: settings("~/.gemini/settings.json", userSettings)},
		{id: "gm-user-beforeagent", where: "home"},
		{id: "gm-user-mcp", where: "home"},
		{id: "gm-user-discovery", where: "home"},
		{id: "gm-ext-mcp", where: "home", plant: `mkdir -p ` + ext + ` && printf '%s' '{"name":"cwext","version":"1.0.0","contextFileName":"CWCTX.md","mcpServers":{` + mcp("cwextmcp", "gm-ext-mcp") + `}}' > ` + ext + `/gemini-extension.json`},
		{id: "gm-ext-hook", where: "home", plant: `mkdir -p ` + ext + `/hooks && printf '%s' '{"hooks":{"SessionStart":` + hook("gm-ext-hook") + `}}' > ` + ext + `/hooks/hooks.json`},
		{id: "gmextcontext", where: "home", instruction: true, plant: `echo "` + codeWord("gmextcontext", nonce) + `" > ` + ext + `/CWCTX.md`},
		{id: "gmusermd", where: "home", instruction: true, plant: `echo "` + codeWord("gmusermd", nonce) + `" > ~/.gemini/GEMINI.md`},
		{id: "gmuserimport", where: "home", instruction: true, plant: `echo "` + codeWord("gmuserimport", nonce) + `" > ~/.gemini/cwimp.md && echo '@./cwimp.md' >> ~/.gemini/GEMINI.md`},
		{id: "gmusercommand", where: "home", instruction: true, plant: `mkdir -p ~/.gemini/commands && printf 'description = "cw"\nprompt = "%s {{args}}"\n' "` + codeWord("gmusercommand", nonce) + `" > ~/.gemini/commands/cwcmd.toml`},
		{id: "gmuserskill", where: "home", instruction: true, plant: skill("~/.gemini/skills", "gmuserskill")},
		{id: "gmuseragentsskill", where: "home", instruction: true, plant: skill("~/.agents/skills", "gmuseragentsskill")},
		{id: "gmuseragent", where: "home", instruction: true, plant: agentFile("~/.gemini/agents", "gmuseragent")},
		// The .env search loads one file: the first of /work/.gemini/.env,
		// /work/.env, (/.gemini/.env, /.env,) ~/.gemini/.env, ~/.env. The
		// control runs the CLI once more after removing each (geminiEnvRuns).
		{id: "gmhomeenv", where: "home", instruction: true, plant: systemMD("~/.env", "/home/agent/cwsys-home.md", "gmhomeenv")},
		{id: "gmhomegeminienv", where: "home", instruction: true, plant: systemMD("~/.gemini/.env", "/home/agent/.gemini/cwsys.md", "gmhomegeminienv")},
		// Folder trust is on by default in 0.61.0 and --skip-trust does not
		// reach the settings loader: the project layer loads for a folder
		// trusted in ~/.gemini/trustedFolders.json, which the turn adds (a
		// HOME file: reset, like the rest of ~/.gemini).
		{id: "gm-proj-sessionstart", where: "worktree", plant: settings("/work/.gemini/settings.json", projectSettings) + ` && echo '{"/work":"TRUST_FOLDER"}' > ~/.gemini/trustedFolders.json`},
		{id: "gm-proj-mcp", where: "worktree"},
		// Not in the corpus, because they did not fire in the bare control
		// (both are guarded all the same: .gemini and GEMINI.md are masked):
		// a subdirectory's GEMINI.md (0.61.0 loads it only when a tool reads
		// that directory) and a project subagent in .gemini/agents (0.61.0
		// registers it only once acknowledged by content hash in HOME).
		{id: "gmprojmd", where: "worktree", instruction: true, plant: `echo "` + codeWord("gmprojmd", nonce) + `" > /work/GEMINI.md`},
		{id: "gmprojskill", where: "worktree", instruction: true, plant: skill("/work/.gemini/skills", "gmprojskill")},
		{id: "gmprojagentsskill", where: "worktree", instruction: true, plant: skill("/work/.agents/skills", "gmprojagentsskill")},
		{id: "gmworkenv", where: "worktree", instruction: true, plant: systemMD("/work/.env", "/work/cwsys.md", "gmworkenv")},
		{id: "gmprojenv", where: "worktree", instruction: true, plant: systemMD("/work/.gemini/.env", "/work/.gemini/cwsys.md", "gmprojenv")},
	}
}

// gmToolOutputs finds the shell tool's answers in a Gemini API request.
var gmToolOutputs = regexp.MustCompile(`"output":"(?:[^"\\]|\\.)*"`)

// gmWorktreeRoots are the guarded roots the worktree vectors plant.
var gmWorktreeRoots = []string{".gemini", "GEMINI.md", ".env", ".agents"}

// geminiEnvRuns are the control's extra runs: the .env search loads only
// the first file it finds, so each run removes the one the run before
// loaded and starts the CLI again.
var geminiEnvRuns = []string{"/work/.gemini/.env", "/work/.env", "/home/agent/.gemini/.env"}

// TestGeminiPersistenceCorpus: Gemini CLI's and the shell's persistence
// vectors, each firing in a bare `podman run` of the same image (the
// positive control: --skip-trust, the key and base URL in the
// environment, no system settings) and none through shrooms (the same
// flags), the session still resumed with --resume latest.
func TestGeminiPersistenceCorpus(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	// Gemini CLI 0.61.0's shell tool runs git with GIT_CONFIG_GLOBAL and
	// GIT_CONFIG_SYSTEM at /dev/null (and core.fsmonitor, core.hooksPath
	// emptied): HOME's git config is no vector through it, and
	// `git config --global` cannot even plant one.
	var vectors []corpusVector
	for _, v := range shellVectors(e.Prefix) {
		if !strings.Contains(v.id, "git") {
			vectors = append(vectors, v)
		}
	}
	vectors = append(vectors, geminiVectors(e.Prefix)...)
	// Gemini CLI's shell tool refuses a command with $(...) in it, so the
	// script goes base64-encoded to sh (the command text then holds no code
	// word and no "planted-ID": only the plant's output does).
	plant := func(cmd string) modelapi.Step {
		return gmShell("echo " + base64.StdEncoding.EncodeToString([]byte(cmd+"\n")) + " | base64 -d | sh")
	}
	gemini := []string{"gemini", "--skip-trust", "--yolo"}
	runCorpus(t, e, "gemini", vectors, plant,
		func(prompt string) string {
			code, out, errb := e.CLI("--json", "run", "--task", e.Task("gemini"), "--agent", "gemini", "--worktree", e.Worktree, "--no-stdin", "--", "-p", prompt)
			assert.Equal(t, code, 0, "turn 1: %s %s\n%s", out, errb, e.API.Log())
			var res struct {
				Changes struct {
					AgentConfig []struct{ Path, Why string } `json:"agent_config"`
				} `json:"worktree_changes"`
			}
			lastJSON(t, out, &res)
			var listed []string
			for _, a := range res.Changes.AgentConfig {
				assert.Check(t, a.Why != "", "%+v", a)
				listed = append(listed, a.Path)
			}
			for _, root := range gmWorktreeRoots {
				assert.Check(t, slices.Contains(listed, root), "run --json lists %s as agent config: %v", root, listed)
			}
			bodies := requestBodies(e.API.Scripted())
			for _, v := range vectors {
				if v.plant != "" {
					assert.Assert(t, strings.Contains(bodies, "planted-"+v.id), "the plant of %s ran; the tool's answers:\n%s", v.id, strings.Join(gmToolOutputs.FindAllString(bodies[strings.LastIndex(bodies, `"contents"`):], -1), "\n"))
				}
			}
			return "latest"
		},
		func(session, prompt string) []string {
			// The extra runs each answer one request (scripted here: the
			// control starts right after this returns).
			// The API-key sign-in, as Gemini CLI records it in the user's
			// settings (in the cage the system settings select it).
			script := `python3 -c 'import json,os; p=os.path.expanduser("~/.gemini/settings.json"); d=json.load(open(p)); d.setdefault("security",{})["auth"]={"selectedType":"gemini-api-key"}; json.dump(d,open(p,"w"))' && `
			script += strings.Join(append(gemini, "--resume", session, "-p", "'"+gmCommand+" "+prompt+"'"), " ")
			for i, f := range geminiEnvRuns {
				e.API.Append(modelapi.Text("env run " + e.Prefix))
				script += " && rm " + f + " && " + strings.Join(append(gemini, "-p", "'env run "+string(rune('a'+i))+"'"), " ")
			}
			return []string{"sh", "-c", script}
		},
		[]string{"GEMINI_API_KEY=" + geminiKey, "GOOGLE_GEMINI_BASE_URL=" + e.APIURL, "GEMINI_TELEMETRY_ENABLED=false"},
		func(session, prompt string) (string, guardResult) {
			out, res := turnJSON(e, "gemini", "--resume", session, "-p", gmCommand+" "+prompt)
			assert.Assert(t, res.WorktreeGuard != nil, out)
			for _, root := range gmWorktreeRoots {
				assert.Check(t, slices.Contains(res.WorktreeGuard.Masked, root), "%s is masked in the next cage: %v", root, res.WorktreeGuard.Masked)
			}
			return out, res
		})
	// In turn 2 the masked /work/.env (an empty stand-in) ends the .env
	// search before HOME: HOME's two are shown gone by the reset itself.
	home := homeDir(e, "gemini")
	for _, f := range []string{".env", ".gemini/.env", ".gemini/trustedFolders.json"} {
		_, err := os.Lstat(filepath.Join(home, f))
		assert.Assert(t, os.IsNotExist(err), "~/%s survived the reset: %v", f, err)
	}
}
