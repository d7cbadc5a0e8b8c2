"""A bounded parser for the bash subset that launch scripts use.

Accepted: simple commands with assignments and redirections, pipelines, && / ||, ``;`` and ``&``,
if/elif/else, for (list and arithmetic), while/until, case, functions, { } and ( ) groups,
(( )), [[ ]], heredocs (quoted or not, ``<<-``), here-strings, quotes of every kind, ``$( )``,
backticks, ``$(( ))``, ``${…}`` with its operators, arrays and line continuations.
Nothing is executed here; parse errors carry the line they happened on.

The parser is incremental (:meth:`Parser.parse_next` gives one top-level command at a time) so that
the evaluator can stop at ``exit`` or at its budget without reading the rest of a huge script.
"""
from __future__ import annotations

import re
from typing import Optional

from .limits import MAX_ARRAY_ITEMS, MAX_COMMAND_WORDS, MAX_PARSE_DEPTH, MAX_VALUE_CHARS, Budget, CannotPredict
from .shell_ast import (AndOr, Arith, ArithCmd, ArithFor, Assign, Case, CmdSub, Cond, For, FuncDef,
                        Group, If, Lit, Param, Pipeline, Redir, Simple, While)


class ParseError(CannotPredict):
    pass


_CMD_RUN = re.compile(r"[^\s'\"\\$`;&|<>()]+")
_BRACE_RUN = re.compile(r"[^'\"\\$`}/]+")
_DQ_RUN = re.compile(r"[^\"\\$`]+")
_HD_RUN = re.compile(r"[^\\$`]+")
_COND_RUN = re.compile(r"[^\s'\"\\$`;]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
_REDIR = re.compile(r"(\d{0,2})(>>|>&|>\||<<<|<<-|<<|<&|<>|>|<)|&>>|&>")
_PLAIN_WORD = re.compile(r"[^\s'\"\\$`;&|<>()]+")
_BLANK = re.compile(r"(?:[ \t\r\f\v]|\\\n)*")
_GAP = re.compile(r"(?:[ \t\r\f\v\n]|\\\n|#[^\n]*)*")     # blanks, newlines and comments
_SPECIAL_PARAMS = set("@*#?$!-0123456789")
_CMD_BREAK = frozenset(" \t\r\n;&|<>()\f\v")    # what ends a word in a command (see _parts)
# A run of command arguments that _simple would read one by one as plain literals: each starts
# where no comment or quote can and ends at a word break other than '<' or '>' (so that no word is
# a redirection's fd, as `2>log`), blanks after it.  At most one word more than a command may
# have: the match itself is bounded, not only what is kept of it (a 3 MiB `echo a a a …` took one
# match 1.5 s, past the parse's deadline, before the word count refused it).
_ARG_RUN = re.compile(r"(?:[^\s'\"\\$`;&|<>()#][^\s'\"\\$`;&|<>()]*(?=[ \t\r\n;&|()\f\v]|\Z)"
                      r"(?:[ \t\r\f\v]|\\\n)*){1,%d}" % (MAX_COMMAND_WORDS + 1))
# The words _command reads as other than a simple command's first word
_COMPOUND_WORDS = frozenset(("if", "while", "until", "for", "select", "case", "{", "function",
                             "then", "elif", "else", "fi", "do", "done", "esac", "}"))
_RUNS = {"cmd": _CMD_RUN, "cond": _COND_RUN, "brace": _BRACE_RUN, "dq": _DQ_RUN, "heredoc": _HD_RUN}
_ANSI = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f",
         "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
_ANSI_PLAIN = re.compile(r"[^\\']+")
_ANSI_HEX = re.compile(r"[0-9a-fA-F]{1,2}")
_ANSI_WORD = re.compile(r"(?:[^\\']+|\\.)*", re.S)    # a $'...' word's text, up to its closing quote


class Parser:
    """Parse ``text`` (from file ``label``); line numbers are offset by ``line_offset``."""

    def __init__(self, text: str, label: str, budget: Budget, line_offset=0, depth: int = 0,
                 origin_of_pos=None):
        self.text = text
        self.n = len(text)
        self.pos = 0
        self.label = label
        self.budget = budget
        self.line_offset = line_offset
        self.depth = depth
        self._lc_pos, self._lc_line = 0, 1   # line-number cache: counting is lazy (huge inputs)
        self._pending: list[tuple[Redir, str, bool, bool]] = []
        self._peeked: tuple[int, Optional[str]] = (-1, None)
        # For text built by the shell itself (`bash -c "$CMD"`): position -> "file:line" of the
        # piece it came from. Then "lines" are origin strings instead of ints.
        self.origin_of_pos = origin_of_pos
        if isinstance(line_offset, str):
            const = line_offset
            self.origin_of_pos = lambda _p: const

    # ------------------------------------------------------------------ helpers
    def line_at(self, pos: int):
        if self.origin_of_pos is not None:
            return self.origin_of_pos(pos)
        if pos >= self._lc_pos:
            line = self._lc_line + self.text.count("\n", self._lc_pos, pos)
            self._lc_pos, self._lc_line = pos, line
        else:
            line = 1 + self.text.count("\n", 0, pos)
        return line + self.line_offset

    def where(self, pos: Optional[int] = None) -> str:
        line = self.line_at(self.pos if pos is None else pos)
        return line if isinstance(line, str) else f"{self.label}:{line}"

    def error(self, msg: str, pos: Optional[int] = None) -> ParseError:
        return ParseError(msg, self.where(pos))

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_PARSE_DEPTH:
            raise CannotPredict("shell constructs nested too deeply", self.where())
        self.budget.tick(self.label)

    def _leave(self) -> None:
        self.depth -= 1

    def _skip_blanks(self) -> None:
        pos = self.pos
        if pos < self.n:
            # the common cases, without a regex call: no blank, or one space between words
            c = self.text[pos]
            if c not in " \t\r\f\v\\":
                return
            if c == " " and pos + 1 < self.n and self.text[pos + 1] not in " \t\r\f\v\\":
                self.pos = pos + 1
                return
        self.pos = _BLANK.match(self.text, pos).end()

    def _skip_comment(self) -> None:
        if self.pos < self.n and self.text[self.pos] == "#":
            nl = self.text.find("\n", self.pos)
            self.pos = self.n if nl < 0 else nl

    def _newline(self) -> None:
        """Consume one newline and read the heredoc bodies that were waiting for it."""
        self.pos += 1
        if self._pending:
            pending, self._pending = self._pending, []
            for redir, delim, strip, quoted in pending:
                self._read_heredoc(redir, delim, strip, quoted)

    def _skip_space_nl(self) -> None:
        """Blanks, comments and newlines (inside compounds and after && | etc.)."""
        while True:
            self._skip_blanks()
            if self.pos >= self.n:
                return
            c = self.text[self.pos]
            if c == "#":
                self._skip_comment()
            elif c == "\n":
                self._newline()
            else:
                return

    def _peek_word(self) -> Optional[str]:
        """The plain word at pos (for reserved-word checks), without consuming it."""
        if self._peeked[0] == self.pos:     # a command's start is peeked at up to three times
            return self._peeked[1]
        m = _PLAIN_WORD.match(self.text, self.pos)
        w = m.group(0) if m else None
        self._peeked = (self.pos, w)
        return w

    def _at_keyword(self, words: set) -> Optional[str]:
        w = self._peek_word()
        if w in words:
            return w
        if "}" in words and w and w.startswith("}") and w.strip("}") == "":
            return "}"
        return None

    def _expect_keyword(self, kw: str) -> None:
        self._skip_space_nl()
        w = self._peek_word()
        if w != kw:
            raise self.error(f"expected '{kw}'" + (f" but found '{w}'" if w else ""))
        self.pos += len(kw)

    # ------------------------------------------------------------------ lists
    def parse_next(self):
        """The next top-level command (an AndOr), or None at the end of the text."""
        while True:
            if not self._pending:
                # the header's comment lines and blank lines at once (no heredoc body to read)
                self.pos = _GAP.match(self.text, self.pos).end()
            self._skip_blanks()
            if self.pos >= self.n:
                if self._pending:
                    raise self.error(f"unterminated heredoc '{self._pending[0][1]}'")
                return None
            c = self.text[self.pos]
            if c == "#":
                self._skip_comment()
            elif c == "\n":
                self._newline()
            elif c in ";&":
                if self.text.startswith(";;", self.pos):
                    raise self.error("';;' outside a case statement")
                self.pos += 1
            elif c == ")" or (c == "}" and self._at_keyword({"}"})):
                raise self.error(f"unexpected '{c}'")
            else:
                w = self._peek_word()
                if w in ("then", "elif", "else", "fi", "do", "done", "esac", "in"):
                    raise self.error(f"unexpected '{w}'")
                node = self._and_or()
                self._skip_blanks()
                if self.pos < self.n and self.text[self.pos] in ";&" and not self.text.startswith(";;", self.pos) \
                        and not self.text.startswith("&&", self.pos):
                    self.pos += 1
                if self._pending:
                    # heredoc bodies follow this line: read them before the command runs
                    self._skip_blanks()
                    self._skip_comment()
                    if self.pos < self.n and self.text[self.pos] == "\n":
                        self._newline()
                    elif self.pos >= self.n:
                        raise self.error(f"unterminated heredoc '{self._pending[0][1]}'")
                return node

    def parse_all(self) -> list:
        out = []
        while True:
            node = self.parse_next()
            if node is None:
                return out
            out.append(node)

    def _list(self, terms: set, closer: Optional[str] = None) -> list:
        """Commands until one of the reserved words ``terms`` (or the char ``closer``)."""
        self._enter()
        body = []
        while True:
            self._skip_space_nl()
            if self.pos >= self.n:
                return self._fail_eof(terms, closer)
            c = self.text[self.pos]
            if closer and c == closer:
                break
            if c in ";&":
                if self.text.startswith(";;", self.pos) or self.text.startswith(";&", self.pos):
                    if ";;" in terms:
                        break
                    raise self.error("';;' outside a case statement")
                self.pos += 1
                continue
            if self._at_keyword(terms):
                break
            if c == ")":
                raise self.error("unexpected ')'")
            body.append(self._and_or())
            self._skip_blanks()
            if self.pos < self.n and self.text[self.pos] in ";&" and not self.text.startswith(";;", self.pos) \
                    and not self.text.startswith(";&", self.pos):
                self.pos += 1
        self._leave()
        return body

    def _fail_eof(self, terms: set, closer: Optional[str]):
        want = closer or "/".join(sorted(t for t in terms if t != ";;"))
        raise self.error(f"unexpected end of file (missing '{want}')")

    def _and_or(self):
        line = self.line_at(self.pos)
        items = [(None, self._pipeline())]
        while True:
            self._skip_blanks()
            if self.text.startswith("&&", self.pos) or self.text.startswith("||", self.pos):
                op = self.text[self.pos:self.pos + 2]
                self.pos += 2
                self._skip_space_nl()
                items.append((op, self._pipeline()))
            else:
                break
        return AndOr(items, line)

    def _pipeline(self):
        self._skip_blanks()
        line = self.line_at(self.pos)
        negate = False
        w = self._peek_word()
        if w == "time":
            self.pos += 4
            self._skip_blanks()
            if self.text.startswith("-p", self.pos):
                self.pos += 2
            self._skip_blanks()
            w = self._peek_word()
        if w == "!":
            negate = True
            self.pos += 1
            self._skip_blanks()
        cmds = [self._command()]
        while True:
            self._skip_blanks()
            if self.pos < self.n and self.text[self.pos] == "|" and not self.text.startswith("||", self.pos):
                self.pos += 2 if self.text.startswith("|&", self.pos) else 1
                self._skip_space_nl()
                cmds.append(self._command())
            else:
                break
        return Pipeline(cmds, negate, line)

    # ------------------------------------------------------------------ commands
    def _command(self):
        self.budget.tick(self.label)
        self._skip_blanks()
        if self.pos >= self.n:
            raise self.error("unexpected end of file (command expected)")
        line = self.line_at(self.pos)
        c = self.text[self.pos]
        if c == "(":
            if self.text.startswith("((", self.pos):
                expr = self._arith_text(self.pos + 2, line)
                node = ArithCmd(expr, line)
            else:
                self.pos += 1
                self._enter()
                body = self._list(set(), closer=")")
                self._leave()
                self.pos += 1
                node = Group(body, True, line)
            self._compound_redirs()
            return node
        w = self._peek_word()
        if w not in _COMPOUND_WORDS:
            return self._simple(line)
        if w == "if":
            node = self._if(line)
        elif w in ("while", "until"):
            self.pos += len(w)
            self._enter()
            cond = self._list({"do"})
            self._expect_keyword("do")
            body = self._list({"done"})
            self._expect_keyword("done")
            self._leave()
            node = While(cond, body, w == "until", line)
        elif w in ("for", "select"):
            node = self._for(line)
        elif w == "case":
            node = self._case(line)
        elif w == "{":
            self.pos += 1
            self._enter()
            body = self._list({"}"})
            self._expect_keyword("}")
            self._leave()
            node = Group(body, False, line)
        elif w == "function":
            self.pos += len(w)
            self._skip_blanks()
            m = _PLAIN_WORD.match(self.text, self.pos)
            if not m:
                raise self.error("function name expected")
            name = m.group(0)
            self.pos = m.end()
            self._skip_blanks()
            if self.text.startswith("()", self.pos):
                self.pos += 2
            self._skip_space_nl()
            return FuncDef(name, self._command(), line)
        elif w in ("then", "elif", "else", "fi", "do", "done", "esac", "}"):
            raise self.error(f"unexpected '{w}'")
        else:
            return self._simple(line)
        self._compound_redirs()
        return node

    def _compound_redirs(self) -> None:
        """Redirections after a compound command (`done < file`, `} > log`): parsed, then ignored."""
        while True:
            self._skip_blanks()
            m = _REDIR.match(self.text, self.pos)
            if not m:
                return
            self._redirect(m, self.line_at(self.pos))

    def _if(self, line: int):
        self.pos += 2
        self._enter()
        clauses = []
        cond = self._list({"then"})
        self._expect_keyword("then")
        body = self._list({"elif", "else", "fi"})
        clauses.append((cond, body))
        else_body = None
        while True:
            self._skip_space_nl()
            w = self._peek_word()
            if w == "elif":
                self.pos += 4
                cond = self._list({"then"})
                self._expect_keyword("then")
                body = self._list({"elif", "else", "fi"})
                clauses.append((cond, body))
            elif w == "else":
                self.pos += 4
                else_body = self._list({"fi"})
            elif w == "fi":
                self.pos += 2
                break
            else:
                raise self.error("expected 'fi'")
        self._leave()
        return If(clauses, else_body, line)

    def _for(self, line: int):
        self.pos += 3 if self.text.startswith("for", self.pos) else 6
        self._skip_blanks()
        self._enter()
        if self.text.startswith("((", self.pos):
            parts = self._arith_raw(self.pos + 2)
            pieces = _split_top(parts, ";")
            if len(pieces) != 3:
                raise self.error("for (( )) needs three expressions")
            sub = [self._sub_word(p, line) for p in pieces]
            self._skip_blanks()
            if self.pos < self.n and self.text[self.pos] == ";":
                self.pos += 1
            self._skip_space_nl()
            w = self._peek_word()
            if w == "{":
                self.pos += 1
                body = self._list({"}"})
                self._expect_keyword("}")
            else:
                self._expect_keyword("do")
                body = self._list({"done"})
                self._expect_keyword("done")
            self._leave()
            return ArithFor(sub[0], sub[1], sub[2], body, line)
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error("for: variable name expected")
        var = m.group(0)
        self.pos = m.end()
        self._skip_space_nl()
        items = None
        if self._peek_word() == "in":
            self.pos += 2
            items = []
            while True:
                self._skip_blanks()
                if self.pos >= self.n:
                    raise self.error("unexpected end of file in for")
                c = self.text[self.pos]
                if c in ";\n":
                    if c == "\n":
                        self._newline()
                    else:
                        self.pos += 1
                    break
                if c == "#":
                    self._skip_comment()
                    continue
                items.append(self._word("cmd"))
        self._skip_space_nl()
        self._expect_keyword("do")
        body = self._list({"done"})
        self._expect_keyword("done")
        self._leave()
        return For(var, items, body, line)

    def _case(self, line: int):
        self.pos += 4
        self._skip_blanks()
        word = self._word("cmd")
        self._skip_space_nl()
        self._expect_keyword("in")
        self._enter()
        items = []
        while True:
            self._skip_space_nl()
            if self.pos >= self.n:
                raise self.error("unexpected end of file (missing 'esac')")
            if self._peek_word() == "esac":
                self.pos += 4
                break
            if self.text[self.pos] == "(":
                self.pos += 1
            pats = []
            while True:
                self._skip_blanks()
                if self.pos >= self.n:
                    raise self.error("unexpected end of file in case pattern")
                c = self.text[self.pos]
                if c == ")":
                    self.pos += 1
                    break
                if c == "|":
                    self.pos += 1
                    continue
                if c == "\n":
                    raise self.error("case pattern not closed with ')'")
                pats.append(self._word("cmd"))
            body = self._list({"esac", ";;"})
            self._skip_blanks()
            for term in (";;&", ";;", ";&"):
                if self.text.startswith(term, self.pos):
                    self.pos += len(term)
                    break
            items.append((pats, body))
        self._leave()
        return Case(word, items, line)

    def _simple(self, line: int):
        assigns: list = []
        words: list = []
        redirs: list = []
        decl = None     # whether words[0] declares (export, local ...): read once it is there
        runs = self.origin_of_pos is None   # whether runs of plain arguments may be read at once
        text, n = self.text, self.n
        while True:
            self._skip_blanks()
            if self.pos >= n:
                break
            c = text[self.pos]
            if c in "\n;|)":
                break
            self.budget.tick(self.label)
            if len(words) + len(assigns) > MAX_COMMAND_WORDS:
                raise CannotPredict(f"a command of more than {MAX_COMMAND_WORDS} words", self.where())
            if words and runs:
                if decl is None:
                    decl = _is_decl(words[0])
                if not decl:
                    got = self._plain_args(words, len(words) + len(assigns))
                    if got:
                        continue
                    runs = got is not None
            if c == "&":
                if _REDIR.match(self.text, self.pos):
                    m = _REDIR.match(self.text, self.pos)
                    redirs.append(self._redirect(m, self.line_at(self.pos)))
                    continue
                break
            if c == "#" and (words or assigns or redirs):
                self._skip_comment()
                continue
            if c == "#":
                self._skip_comment()
                continue
            # Only a (Unicode) digit or '<' / '>' can start a redirection here ('&' is above).
            m = _REDIR.match(self.text, self.pos) if c in "<>" or c.isdecimal() else None
            if m and (m.group(1) or c in "<>"):
                if c == "<" and self.text.startswith("<(", self.pos) or c == ">" and self.text.startswith(">(", self.pos):
                    words.append(self._word("cmd"))
                    continue
                redirs.append(self._redirect(m, self.line_at(self.pos)))
                continue
            if c == "(":
                if len(words) == 1 and not assigns and len(words[0]) == 1 and isinstance(words[0][0], Lit) \
                        and not words[0][0].quoted and re.match(r"\(\s*\)", self.text[self.pos:self.pos + 8]):
                    self.pos = re.compile(r"\(\s*\)").match(self.text, self.pos).end()
                    self._skip_space_nl()
                    return FuncDef(words[0][0].text, self._command(), line)
                raise self.error("unexpected '('")
            if not words:
                am = _ASSIGN.match(self.text, self.pos)
                if am:
                    assigns.append(self._assignment(am))
                    continue
            elif decl if decl is not None else (decl := _is_decl(words[0])):
                am = _ASSIGN.match(self.text, self.pos)
                if am:
                    words.append(self._assignment(am))
                    continue
            word = self._word("cmd")
            if not words and not assigns and len(word) == 1 and isinstance(word[0], Lit) \
                    and not word[0].quoted and word[0].text == "[[":
                return self._cond(line)
            words.append(word)
        return Simple(assigns, words, redirs, line)

    def _plain_args(self, words: list, count: int) -> Optional[bool]:
        """Read the run of plain arguments at pos (``--num-layers 24 \\``…), each as _parts would
        read it: one unquoted literal on the line it is written on.  False (nothing read) where the
        word-by-word loop must decide; None where the run would pass a bound that loop checks (no
        run is tried again in this command: each try reads the rest of the run)."""
        # (no further than a run may reach: one that does is refused below, so where the text
        # beyond that point makes the last word end does not matter)
        m = _ARG_RUN.match(self.text, self.pos, self.pos + MAX_VALUE_CHARS * 4 + 1)
        if m is None:
            return False
        run = m.group()
        if len(run) > MAX_VALUE_CHARS * 4:
            return None
        pieces = run.split("\\\n")     # a continuation is the only line break inside a run
        new = [piece.split() for piece in pieces]
        k = sum(map(len, new))
        if count + k - 1 > MAX_COMMAND_WORDS:
            return None
        line = self.line_at(self.pos)
        for i, piece_words in enumerate(new):
            for w in piece_words:
                words.append([Lit(w, line + i, False)])
        self.budget.tick_n(k - 1, self.label)   # the word-by-word loop's ticks for the words after the first
        self.pos = m.end()
        return True

    def _redirect(self, m, line: int) -> Redir:
        op = m.group(2) if m.group(2) else m.group(0)
        fd = int(m.group(1)) if m.group(1) else None
        self.pos = m.end()
        self._skip_blanks()
        r = Redir(op, fd, None, line)
        if op in (">&", "<&") and self.pos < self.n and (self.text[self.pos].isdigit() or self.text[self.pos] == "-"):
            d = re.match(r"\d+-?|-", self.text[self.pos:])
            self.pos += d.end()
        else:
            if self.pos >= self.n or self.text[self.pos] in "\n;&|()<>":
                raise self.error(f"redirection '{op}' without a target")
            r.target = self._word("cmd")
            if op in ("<<", "<<-"):
                delim = "".join(p.text if isinstance(p, Lit) else "" for p in r.target)
                quoted = any(isinstance(p, Lit) and p.quoted for p in r.target) or \
                    any(not isinstance(p, Lit) for p in r.target)
                self._pending.append((r, delim, op == "<<-", quoted))
        return r

    def _read_heredoc(self, r: Redir, delim: str, strip: bool, quoted: bool) -> None:
        start = self.pos
        first_line = self.line_at(start)
        # C-speed search for the closing line, bounded by the heredoc size limit
        limit = min(self.n, start + MAX_VALUE_CHARS * 4 + len(delim) + 2)
        i = start
        end_body = -1
        while True:
            i = self.text.find(delim, i, limit) if delim else -1
            if i < 0:
                break
            ls = self.text.rfind("\n", 0, i) + 1
            after = i + len(delim)
            tail_ok = after >= self.n or self.text[after] == "\n" or self.text.startswith("\r\n", after) \
                or (self.text[after] == "\r" and after + 1 >= self.n)
            prefix = self.text[ls:i]
            if ls >= start and tail_ok and (prefix == "" or (strip and prefix.strip("\t") == "")):
                end_body = ls
                nl = self.text.find("\n", after)
                self.pos = self.n if nl < 0 else nl + 1
                break
            i += 1
            self.budget.tick(self.label)
        if end_body < 0:
            if limit < self.n:
                raise ParseError("heredoc too large", self.where(start - 1))
            raise ParseError(f"unterminated heredoc '{delim}'", self.where(start - 1))
        raw = self.text[start:end_body]
        lines_out = raw.split("\n")[:-1] if raw else []
        if strip:
            lines_out = [ln.lstrip("\t") for ln in lines_out]
        body = "\n".join(lines_out) + ("\n" if lines_out else "")
        if quoted:
            r.heredoc = []
            p = start
            for ln in lines_out:
                r.heredoc.append(Lit(ln + "\n", self.line_at(p), True))
                p = self.text.find("\n", p) + 1
        else:
            sub = Parser(body, self.label, self.budget,
                         line_offset=first_line - 1 if isinstance(first_line, int) else first_line,
                         depth=self.depth + 1)
            r.heredoc = sub._parts("heredoc")

    def _assignment(self, am) -> Assign:
        name, idx, plus = am.group(1), am.group(2), am.group(3)
        line = self.line_at(self.pos)
        self.pos = am.end()
        index = idx[1:-1] if idx else None
        if self.pos < self.n and self.text[self.pos] == "(":
            self.pos += 1
            self._enter()
            elems = []
            while True:
                self._skip_blanks()
                if self.pos >= self.n:
                    raise self.error("unterminated array '('", None)
                c = self.text[self.pos]
                if c == ")":
                    self.pos += 1
                    break
                if c == "\n":
                    self._newline()
                    continue
                if c == "#":
                    self._skip_comment()
                    continue
                if c in ";&|<>(":
                    raise self.error(f"unexpected '{c}' in array")
                elems.append(self._word("cmd"))
                self.budget.tick(self.label)
                # the evaluator refuses arrays past MAX_ARRAY_ITEMS anyway: stop parsing there
                if len(elems) > MAX_ARRAY_ITEMS:
                    raise self.error("array literal too large")
            self._leave()
            return Assign(name, index, bool(plus), None, elems, line)
        if self.pos >= self.n or self.text[self.pos] in " \t\n;&|)<>":
            value = []
        else:
            value = self._word("cmd")
        return Assign(name, index, bool(plus), value, None, line)

    def _cond(self, line: int) -> Cond:
        words = []
        while True:
            self._skip_blanks()
            if self.pos >= self.n:
                raise self.error("unterminated '[['")
            c = self.text[self.pos]
            if c == "\n":
                self._newline()
                continue
            w = self._word("cond")
            if len(w) == 1 and isinstance(w[0], Lit) and not w[0].quoted and w[0].text == "]]":
                break
            words.append(w)
            if len(words) > 10_000:
                raise self.error("[[ ]] too long")
        self._compound_redirs()
        return Cond(words, line)

    # ------------------------------------------------------------------ words
    def _word(self, ctx: str) -> list:
        start = self.pos
        parts = self._parts(ctx)
        if self.pos == start:
            raise self.error(f"unexpected '{self.text[self.pos]}'" if self.pos < self.n else "unexpected end of file")
        return parts

    def _parts(self, ctx: str, stop: str = "") -> list:
        """Word parts in context ``ctx``: cmd | cond | brace | dq | heredoc."""
        text, n = self.text, self.n
        if ctx == "cmd":
            # Most command words are one plain run up to a word break: one literal, as below.
            m = _CMD_RUN.match(text, self.pos)
            if m is not None:
                end = m.end()
                if (end >= n or text[end] in _CMD_BREAK) and end - self.pos <= MAX_VALUE_CHARS * 4:
                    word = [Lit(m.group(0), self.line_at(self.pos), False)]
                    self.pos = end
                    return word
        parts: list = []
        quoted_ctx = ctx in ("dq", "heredoc")
        run = _RUNS[ctx]
        size = 0
        while self.pos < n:
            c = text[self.pos]
            if ctx == "cmd" and (c in " \t\r\n;&|<>()" or c == "\f" or c == "\v"):
                break
            if ctx == "cond" and (c in " \t\r\n;"):
                break
            if ctx == "brace" and (c == "}" or c in stop):
                break
            if ctx == "dq" and c == '"':
                break
            m = run.match(text, self.pos)
            if m and m.end() > self.pos:
                s = m.group(0)
                if ctx == "brace" and stop:
                    cut = min((s.find(ch) for ch in stop if ch in s), default=-1)
                    if cut >= 0:
                        s = s[:cut]
                if not s:
                    break
                self._lit(parts, s, self.pos, quoted_ctx)
                self.pos += len(s)
                size += len(s)
                if size > MAX_VALUE_CHARS * 4:
                    raise self.error("word too long")
                continue
            self.budget.tick(self.label)
            if c == "\\":
                size += 2
                if size > MAX_VALUE_CHARS * 4:
                    raise self.error("word too long")
                nxt = text[self.pos + 1] if self.pos + 1 < n else ""
                if nxt == "\n":
                    self.pos += 2
                    continue
                if quoted_ctx:
                    if nxt in ("$`\\" if ctx == "heredoc" else '$`"\\'):
                        self._lit(parts, nxt, self.pos, True)
                        self.pos += 2
                    else:
                        self._lit(parts, "\\", self.pos, True)
                        self.pos += 1
                else:
                    if nxt == "":
                        self.pos += 1
                        continue
                    self._lit(parts, nxt, self.pos, True)
                    self.pos += 2
                continue
            if c == "'" and not quoted_ctx:
                end = text.find("'", self.pos + 1)
                if end < 0:
                    raise self.error("unterminated single quote")
                self._lit(parts, text[self.pos + 1:end], self.pos + 1, True)
                self.pos = end + 1
                continue
            if c == '"' and not quoted_ctx:
                start = self.pos
                self.pos += 1
                self._enter()
                inner = self._parts("dq")
                self._leave()
                if self.pos >= n or text[self.pos] != '"':
                    raise self.error("unterminated double quote", start)
                self.pos += 1
                if not inner:
                    inner = [Lit("", self.line_at(start), True)]
                parts.extend(inner)
                continue
            if c == "$":
                self._dollar(parts, quoted_ctx)
                continue
            if c == "`":
                self._backtick(parts, quoted_ctx)
                continue
            # a lone stop char of an outer context (e.g. '/' in a brace pattern) that run refused
            self._lit(parts, c, self.pos, quoted_ctx)
            self.pos += 1
        return _merge_literals(parts)

    def _lit(self, parts: list, s: str, pos: int, quoted: bool) -> None:
        line = self.line_at(pos)
        if "\n" in s:
            # one part per line so that every token keeps the line it was written on
            off = 0
            for i, piece in enumerate(s.split("\n")):
                self.budget.tick(self.label)
                if i:
                    piece = "\n" + piece
                if piece:
                    parts.append(Lit(piece, self.line_at(pos + off + (1 if i else 0)), quoted))
                off += len(piece) if i else len(piece)
            return
        # Appended as is: _parts merges neighbours once, at its end (merging here, one `+=` per
        # escape, was quadratic in a word's length).
        parts.append(Lit(s, line, quoted))

    def _dollar(self, parts: list, quoted: bool) -> None:
        text, p = self.text, self.pos
        line = self.line_at(p)
        nxt = text[p + 1] if p + 1 < self.n else ""
        if nxt == "(":
            if text.startswith("((", p + 1):
                save = self.pos
                try:
                    expr = self._arith_text(p + 3, line)
                    parts.append(Arith(expr, line, quoted))
                    return
                except ParseError:
                    self.pos = save  # `$((cmd) …)`: a subshell inside a command substitution
            self.pos = p + 2
            self._enter()
            body = self._list(set(), closer=")")
            self._leave()
            self.pos += 1
            parts.append(CmdSub(body, line, quoted))
            return
        if nxt == "{":
            self.pos = p + 2
            self._enter()
            parts.append(self._brace(line, quoted))
            self._leave()
            return
        if nxt == "'" and not quoted:
            self.pos = p + 2
            parts.append(Lit(self._ansi(), line, True))
            return
        if nxt == '"' and not quoted:
            self.pos = p + 1
            return
        m = _NAME.match(text, p + 1)
        if m:
            parts.append(Param(m.group(0), line, quoted))
            self.pos = m.end()
            return
        if nxt and nxt in _SPECIAL_PARAMS:
            parts.append(Param(nxt, line, quoted))
            self.pos = p + 2
            return
        self._lit(parts, "$", p, quoted)
        self.pos = p + 1

    def _ansi(self) -> str:
        """The text of a ``$'...'`` (after its ``$'``), decoded.  Its length is bounded as any
        word's before decoding, runs without escapes are taken whole and escapes are counted on
        the parse's clock: megabytes of escapes must not outrun the parse's deadline."""
        out = []
        text, n, start = self.text, self.n, self.pos
        # (its extent first, in one pass: a word too long is said so before any decoding)
        bound = MAX_VALUE_CHARS * 4
        if _ANSI_WORD.match(text, start, start + bound + 2).end() - start > bound:
            raise self.error("word too long")
        while True:
            if self.pos >= n:
                raise self.error("unterminated $'...'")
            m = _ANSI_PLAIN.match(text, self.pos)
            if m:
                out.append(m.group())
                self.pos = m.end()
                continue
            c = text[self.pos]
            if c == "'":
                self.pos += 1
                return "".join(out)
            self.budget.tick(self.label)
            if self.pos + 1 < n:      # (c is a backslash)
                e = text[self.pos + 1]
                if e == "x":
                    m = _ANSI_HEX.match(text, self.pos + 2, self.pos + 4)
                    if m:
                        out.append(chr(int(m.group(0), 16)))
                        self.pos = m.end()
                        continue
                out.append(_ANSI.get(e, "\\" + e))
                self.pos += 2
                continue
            out.append(c)
            self.pos += 1

    def _brace(self, line: int, quoted: bool) -> Param:
        text = self.text
        op: Optional[str] = None
        if self.pos < self.n and text[self.pos] == "#" and self.pos + 1 < self.n and text[self.pos + 1] != "}":
            self.pos += 1
            op = "len"
        elif self.pos < self.n and text[self.pos] == "!" and self.pos + 1 < self.n and text[self.pos + 1] != "}":
            self.pos += 1
            op = "indirect"
        m = _NAME.match(text, self.pos)
        if m:
            name = m.group(0)
            self.pos = m.end()
        elif self.pos < self.n and (text[self.pos].isdigit()):
            m = re.match(r"\d+", text[self.pos:])
            name = m.group(0)
            self.pos += m.end()
        elif self.pos < self.n and text[self.pos] in _SPECIAL_PARAMS:
            name = text[self.pos]
            self.pos += 1
        else:
            raise self.error("bad substitution")
        index = None
        if self.pos < self.n and text[self.pos] == "[":
            end = _match_bracket(text, self.pos)
            if end < 0:
                raise self.error("bad array subscript")
            index = self._sub_word(text[self.pos + 1:end], self.line_at(self.pos))
            self.pos = end + 1
        if op == "indirect" and index is not None and len(index) == 1 and isinstance(index[0], Lit) \
                and index[0].text in ("@", "*"):
            op = "keys"
        p = Param(name, line, quoted, op=op, index=index)
        if self.pos >= self.n:
            raise self.error("unterminated '${'")
        c = text[self.pos]
        if c == "}":
            self.pos += 1
            return p
        if op in ("len", "keys"):
            raise self.error("bad substitution")
        for o in (":-", ":=", ":+", ":?", "-", "=", "+", "?", "##", "#", "%%", "%", "//", "/#", "/%", "/",
                  "^^", ",,", "^", ",", ":"):
            if text.startswith(o, self.pos):
                break
        else:
            raise self.error("bad substitution")
        self.pos += len(o)
        if o in ("//", "/#", "/%", "/"):
            p.op = o
            p.arg = self._parts("brace", stop="/")
            if self.pos < self.n and text[self.pos] == "/":
                self.pos += 1
                p.arg2 = self._parts("brace")
            else:
                p.arg2 = []
        elif o == ":":
            p.op = "substr"
            p.arg = self._parts("brace", stop=":")
            if self.pos < self.n and text[self.pos] == ":":
                self.pos += 1
                p.arg2 = self._parts("brace")
        else:
            p.op = o
            p.arg = self._parts("brace")
        if self.pos >= self.n or text[self.pos] != "}":
            raise self.error("unterminated '${'")
        self.pos += 1
        return p

    def _backtick(self, parts: list, quoted: bool) -> None:
        start = self.pos
        line = self.line_at(start)
        i = start + 1
        buf = []
        while True:
            if i >= self.n:
                raise self.error("unterminated backquote", start)
            c = self.text[i]
            if c == "\\" and i + 1 < self.n and self.text[i + 1] in "`\\$":
                buf.append(self.text[i + 1])
                i += 2
                continue
            if c == "`":
                break
            buf.append(c)
            i += 1
        self.pos = i + 1
        sub = Parser("".join(buf), self.label, self.budget, line_offset=_offset(line), depth=self.depth + 1)
        if sub.depth > MAX_PARSE_DEPTH:
            raise CannotPredict("shell constructs nested too deeply", self.where())
        parts.append(CmdSub(sub.parse_all(), line, quoted))

    def _arith_raw(self, start: int) -> str:
        """Text up to the matching '))' (pos moves past it)."""
        # Called again for every nested `$((`: the clock is checked on each call, not every 256th.
        self.budget.check_time(self.label)
        depth = 0
        text = self.text
        m = _PAREN_OR_NL.search(text, start)
        while m is not None:
            i = m.start()
            c = text[i]
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    if text.startswith("))", i):
                        self.pos = i + 2
                        return text[start:i]
                    raise self.error("unterminated '(('")
                depth -= 1
            elif c == "\n" and i - start > 4096:
                break
            self.budget.tick(self.label)
            m = _PAREN_OR_NL.search(text, i + 1)
        raise self.error("unterminated '(('")

    def _arith_text(self, start: int, line: int) -> list:
        raw = self._arith_raw(start)
        return self._sub_word(raw, line)

    def _sub_word(self, raw: str, line: int) -> list:
        sub = Parser(raw, self.label, self.budget, line_offset=_offset(line), depth=self.depth + 1)
        if sub.depth > MAX_PARSE_DEPTH:
            raise CannotPredict("shell constructs nested too deeply", self.where())
        return sub._parts("heredoc")


_PAREN_OR_NL = re.compile(r"[()\n]")


def _merge_literals(parts: list) -> list:
    """Join neighbouring literals of the same quoting and line into one (linear time)."""
    if len(parts) < 2:
        return parts
    out: list = []
    run: list = []
    for p in parts:
        if isinstance(p, Lit) and run and run[0].quoted == p.quoted and run[0].line == p.line:
            run.append(p)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else Lit("".join(r.text for r in run), run[0].line, run[0].quoted))
        run = [p] if isinstance(p, Lit) else []
        if not run:
            out.append(p)
    if run:
        out.append(run[0] if len(run) == 1 else Lit("".join(r.text for r in run), run[0].line, run[0].quoted))
    return out


def _offset(line):
    return line - 1 if isinstance(line, int) else line


def _is_decl(word: list) -> bool:
    return len(word) == 1 and isinstance(word[0], Lit) and not word[0].quoted and \
        word[0].text in ("declare", "typeset", "local", "export", "readonly")


def _match_bracket(text: str, start: int) -> int:
    depth = 0
    for i in range(start, min(len(text), start + 4096)):
        c = text[i]
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top(text: str, sep: str) -> list[str]:
    out, depth, cur = [], 0, []
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    out.append("".join(cur))
    return out
