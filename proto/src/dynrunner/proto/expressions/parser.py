"""Expression text → tree, by the runner's operator-precedence parser (`ExpressionParser`).

Errors carry GitHub's wording and the 1-based position of the offending token (counted in
UTF-16 units, as the runner counts): "Unexpected symbol: 'x'. Located at position 3 within
expression: ...". Nested `&&`/`||` are flattened the way GitHub does, which matters for
the depth limit of 50; expressions longer than 21,000 characters are refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.lexer import Lexer, Token, TokenKind
from dynrunner.proto.expressions.nodes import (
    And,
    Call,
    Comparison,
    Container,
    FunctionInfo,
    Index,
    Literal,
    NamedValue,
    Node,
    Not,
    Or,
    Wildcard,
)
from dynrunner.proto.expressions.values import utf16_len

MAX_DEPTH = 50
MAX_LENGTH = 21000

K = TokenKind
_OPEN_KINDS = (K.START_GROUP, K.START_INDEX, K.START_PARAMETERS, K.SEPARATOR)


def parse_error(description: str, token: Token | None, expression: str) -> ExpressionError:
    if token is None:
        return ExpressionError(description, kind="parse")
    position = utf16_len(expression[: token.index]) + 1
    return ExpressionError(
        f"{description}: '{token.raw}'. Located at position {position} within expression: {expression}",
        kind="parse",
        position=position,
    )


class _Parser:
    def __init__(self, expression: str, named_values: Collection[str], functions: Mapping[str, FunctionInfo]) -> None:
        self.expression = expression
        self.named_values = named_values
        self.functions = functions
        self.lexer = Lexer(expression)
        self.operands: list[Node] = []
        self.operators: list[Token] = []
        self.token: Token | None = None
        self.last: Token | None = None
        self.call_tokens: dict[int, Token] = {}

    def error(self, description: str, token: Token | None) -> ExpressionError:
        return parse_error(description, token, self.expression)

    def parse(self) -> Node | None:
        while (token := self.lexer.next_token()) is not None:
            self.token = token
            if token.kind is K.UNEXPECTED:
                raise self.error("Unexpected symbol", token)
            if token.is_operator:
                self.push_operator(token)
            else:
                self.push_operand(token)
            self.last = token

        last = self.last
        if last is None:
            return None
        if self.operators:
            if last.kind in (K.END_GROUP, K.END_INDEX, K.END_PARAMETERS):
                unexpected = False
            elif last.kind is K.FUNCTION:
                unexpected = True
            else:
                unexpected = last.is_operator
            if unexpected or self.lexer.unclosed:
                raise self.error("Unexpected end of expression", last)
        while self.operators:
            self.flush_top()
        if len(self.operands) != 1:
            raise self.error("Unexpected symbol", last)
        root = self.operands[0]
        self.check_depth(root)
        return root

    def push_operand(self, token: Token) -> None:
        node: Node
        if token.kind is K.FUNCTION:
            info = self.functions.get(token.raw.lower())
            if info is None:
                raise self.error("Unrecognized function", token)
            node = Call(token.raw, info)
            self.call_tokens[id(node)] = token
        elif token.kind is K.NAMED_VALUE:
            if token.raw.lower() not in self.named_values:
                raise self.error("Unrecognized named-value", token)
            node = NamedValue(token.raw)
        elif token.kind is K.PROPERTY_NAME:
            node = Literal(token.raw)
        elif token.kind is K.WILDCARD:
            node = Wildcard()
        else:
            node = Literal(token.value)
        self.operands.append(node)

    def push_operator(self, token: Token) -> None:
        if token.left_to_right:
            while self.operators:
                top = self.operators[-1]
                if token.precedence <= top.precedence and top.kind not in _OPEN_KINDS:
                    self.flush_top()
                    continue
                break
        self.operators.append(token)
        if token.kind in (K.END_GROUP, K.END_INDEX, K.END_PARAMETERS):
            self.flush_top()

    def pop_operator(self, expected: TokenKind) -> Token:
        if not self.operators or self.operators[-1].kind is not expected:
            raise self.error("Unexpected symbol", self.token)
        return self.operators.pop()

    def pop_operands(self, count: int) -> list[Node]:
        if len(self.operands) < count:
            raise self.error("Unexpected symbol", self.token)
        if count == 0:
            return []
        result = self.operands[-count:]
        del self.operands[-count:]
        return result

    def flush_top(self) -> None:
        kind = self.operators[-1].kind
        if kind is K.END_INDEX:
            self.pop_operator(K.END_INDEX)
            self.pop_operator(K.START_INDEX)
            self.operands.append(Index(self.pop_operands(2)))
            return
        if kind is K.END_GROUP:
            self.pop_operator(K.END_GROUP)
            self.pop_operator(K.START_GROUP)
            return
        if kind is K.END_PARAMETERS:
            self.flush_end_parameters()
            return

        operator = self.operators.pop()
        node = self.operator_node(operator)
        for operand in self.pop_operands(operator.operand_count):
            if isinstance(node, (And, Or)) and type(operand) is type(node) and isinstance(operand, Container):
                node.params.extend(operand.params)
            else:
                node.params.append(operand)
        self.operands.append(node)

    def operator_node(self, operator: Token) -> Container:
        if operator.kind is K.DEREFERENCE:
            return Index()
        if operator.kind is K.LOGICAL_OPERATOR:
            if operator.raw == "!":
                return Not()
            if operator.raw == "&&":
                return And()
            if operator.raw == "||":
                return Or()
            return Comparison(operator.raw)
        raise self.error("Unexpected symbol", operator)

    def flush_end_parameters(self) -> None:
        self.pop_operator(K.END_PARAMETERS)
        arguments: list[Node] = []
        if self.last is None or self.last.kind is not K.START_PARAMETERS:
            count = 1
            while self.operators and self.operators[-1].kind is K.SEPARATOR:
                count += 1
                self.operators.pop()
            arguments = self.pop_operands(count)
        function = self.operands[-1] if self.operands else None
        if not isinstance(function, Call):
            raise self.error("Unexpected symbol", self.token)
        function.params.extend(arguments)
        self.pop_operator(K.START_PARAMETERS)
        info, count = function.info, len(function.params)
        token = self.call_tokens.get(id(function))
        if count < info.min_args:
            raise self.error("Too few parameters supplied", token)
        if count > info.max_args:
            raise self.error("Too many parameters supplied", token)
        if info.name.lower() == "case" and count % 2 == 0:
            raise self.error("Even number of parameters supplied, requires an odd number of parameters", token)

    def check_depth(self, root: Node) -> None:
        stack = [(root, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise self.error(f"Exceeded max expression depth {MAX_DEPTH}", None)
            stack.extend((child, depth + 1) for child in node.children())


def parse(expression: str, named_values: Collection[str], functions: Mapping[str, FunctionInfo]) -> Node | None:
    """Parse `expression`; `named_values` are lower-case context names, `functions` lower-case names."""
    if utf16_len(expression) > MAX_LENGTH:
        raise parse_error(f"Exceeded max expression length {MAX_LENGTH}", None, expression)
    return _Parser(expression, named_values, functions).parse()
